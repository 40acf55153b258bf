//! parlor-bot's integration tests, one module per area; the doubles are
//! `parlor_bot::testing`'s.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

mod agent;
mod agent_images;
mod cluster;
mod compaction;
mod group_commit;
mod llm_anthropic;
mod llm_failover;
mod llm_http;
mod llm_retry;
mod llm_schema;
mod llm_stream;
mod quoting;
mod roles;
mod session;
mod store;
mod store_pg;
mod tool_bridge;
mod tool_refresh;
mod tool_schema;
mod usage;
