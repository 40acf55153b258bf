//! Built-in toolsets that need nothing but the runtime: `todo_list` (the reference stateful
//! toolset), `time` and prompt-only toolsets.

pub mod prompt;
pub mod terminal;
pub mod time;
pub mod todo;

pub use prompt::PromptToolset;
pub use todo::TodoList;
