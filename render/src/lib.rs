//! # parlor-render — Markdown replies, rendered for each platform
//!
//! One parser, one intermediate form, one renderer per platform. Used by the adapters.
//!
//! **Invariant:** a pure crate: it depends on nothing of parlor and does no I/O; every
//! function is a pure function of its input.
//!
//! ```text
//! markdown --parse--> Document --layout(flavor)--> text + ranges --split--> parts
//!                                                    |-- telegram: text + UTF-16 entities
//!                                                    |-- discord:  Markdown per part
//!                                                    '-- plain:    text (never split)
//! ```
//!
//! - [`parse`] (`parse.rs`) reads CommonMark + GFM tables, strikethrough and task lists with
//!   pulldown-cmark into a [`Document`] (`ir.rs`).
//! - `layout.rs` writes a document as one text with properly nested formatting ranges for a
//!   flavor (bullets, indentation, aligned tables, link policy).
//! - `table.rs` aligns table cells into a monospace grid.
//! - `split.rs` cuts that text into message-sized parts at paragraph, line, then word
//!   boundaries, clipping every range to each part.
//! - [`telegram`], [`discord`], [`plain`] are the entry points.
//!
//! Everything here is a pure function of its input and never panics: the agent's reply is
//! outside input like any other.

mod ir;
mod layout;
mod parse;
mod split;
mod table;

pub mod discord;
pub mod plain;
pub mod telegram;

pub use ir::{Alignment, Block, Cell, Document, List, ListItem, Span, SpanKind, Style, Table};
pub use parse::parse;
pub use table::TABLE_MAX_WIDTH;
