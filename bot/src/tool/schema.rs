//! JSON Schema from Rust types. (Being written; see the tool helper.)
