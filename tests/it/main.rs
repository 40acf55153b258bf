//! The root package's integration tests: the real `parlor` binary against the testkit's fakes on
//! loopback, one module per area.

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

mod support;

mod anthropic;
mod autochat;
mod chaos;
mod cli;
mod cluster;
mod cluster_chaos;
mod console;
mod cost;
mod daemon;
mod delegation;
mod governance;
mod group_life;
mod http;
mod llm_faults;
mod memory;
mod metrics;
mod onebot_auth;
mod postgres;
mod restart;
mod upgrade;
mod vision;
mod web;
mod webhook;
