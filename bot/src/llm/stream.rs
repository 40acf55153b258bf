//! Assembles streamed chat-completion chunks into a [`Completion`](super::Completion).
//! (Being written; see the llm helper.)

/// Accumulates chunks of one streamed completion.
#[derive(Debug, Default)]
pub struct StreamAssembler {}
