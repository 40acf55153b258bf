//! parlor-toolsets's integration tests, one module per toolset or area; shared doubles in
//! `support`. `tests/terminal_env.rs` is a binary of its own: it sets the process's
//! environment, which no other test may share.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

mod autochat;
mod clock_index;
mod clock_schedule;
mod clock_service;
mod clock_tools;
mod llm_requests;
mod mcp;
mod memory;
mod message;
mod quoting;
mod skill;
mod subagent;
mod terminal;
mod terminal_sandbox;
mod time_prompt_todo;
mod todo;
mod web;
