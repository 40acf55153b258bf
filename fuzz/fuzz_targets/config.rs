//! The binary's config parsing (`Config::parse`: TOML text, then every check) on arbitrary
//! text: no panic, and the accessors the daemon calls on a parsed config do not panic
//! either.
//!
//! `parlor` is a binary crate and cannot be a dependency, so its `config.rs` (and the
//! `secrets.rs` it uses) are compiled into this target by path: the same source, no
//! library target added for the fuzzer. Secrets are never resolved here (no file or
//! credential is read).
#![no_main]
// Only parsing is fuzzed; most of these modules' items go unused here.
#![allow(dead_code, unused_imports)]

#[path = "../../src/secrets.rs"]
mod secrets;

#[path = "../../src/config.rs"]
mod config;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = config::Config::parse(text) else {
        return;
    };
    let _ = config.base_url();
    let _ = config.model();
    let _ = config.data_dir();
    let _ = config.request_timeout();
    let _ = config.secret_env_names();
    let _ = config.secret_paths();
});
