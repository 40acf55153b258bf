//! Commands a toolset answers about its own records (`/memory`, `/forget`): registered with
//! [`SessionManager::add_chat_command`](super::SessionManager::add_chat_command), parsed at
//! intake beside ours. A command whose least role is a member's and that writes nothing is
//! answered at intake; any other is queued for the chat's worker
//! ([`PendingKind::ChatCommand`](crate::store::PendingKind::ChatCommand)), which resolves the
//! sender's role, checks it against [`ChatCommand::role`] (data, never an `if` in the
//! toolset), and commits the command's writes with its answer in one transaction.

use crate::lang::Lang;
use crate::store::{KvWrite, Store, StoreError};
use crate::tool::{Caller, Role};

/// What a command answers: its text and the records it changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommandAnswer {
    /// Posted as the reply to the command.
    pub text: String,
    /// Written with the reply in one transaction.
    pub writes: Vec<KvWrite>,
}

/// A toolset's command; see the module docs.
pub trait ChatCommand: Send + Sync {
    /// Its word, with the slash (`/memory`).
    fn word(&self) -> &'static str;

    /// The least role that may run it with `argument` (what follows the word).
    fn role(&self, argument: &str) -> Role;

    /// Whether it may change records with `argument` (then it always runs in the worker).
    fn writes(&self, argument: &str) -> bool;

    /// Its line in `/help`, in `lang`.
    fn help(&self, lang: Lang) -> String;

    /// A line for `/status` about the chat of `session` (the toolset's records there);
    /// `None`: nothing to say.
    fn status(&self, store: &dyn Store, session: &str, lang: Lang) -> Option<String> {
        let _ = (store, session, lang);
        None
    }

    /// Answers it in the chat of `session` for `caller`, in `lang`.
    fn run(
        &self,
        store: &dyn Store,
        session: &str,
        argument: &str,
        caller: &Caller,
        lang: Lang,
    ) -> Result<CommandAnswer, StoreError>;
}

impl super::worker::ChatWorker {
    /// A toolset's command queued for the worker: its role checked, then run; its writes
    /// commit with the answer.
    pub(super) fn chat_command(
        &self,
        session: &super::manager::Session,
        item: &super::queue::QueueItem,
    ) -> super::turn::Outcome {
        let line = item.lines.join(" ");
        let line = line.trim();
        let (word, argument) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let argument = argument.trim();
        let lang = self.manager.effective(session.key()).language;
        let answer = |text: String| super::turn::Outcome {
            reply: Some(text),
            ..super::turn::Outcome::default()
        };
        let Some(command) = self.manager.chat_command(word) else {
            // Registered when it was queued, gone after a restart with another config.
            return answer(crate::lang::say(
                lang,
                crate::lang::Msg::CommandGone,
                &[("word", word)],
            ));
        };
        let caller = item.caller();
        let needed = command.role(argument);
        if !item.private && caller.role < needed {
            return answer(crate::lang::say(
                lang,
                crate::lang::Msg::CommandNeedsRole,
                &[("word", word), ("role", needed.who())],
            ));
        }
        match command.run(
            self.manager.store().as_ref(),
            session.key(),
            argument,
            &caller,
            lang,
        ) {
            Ok(done) => super::turn::Outcome {
                reply: Some(done.text),
                also: done.writes,
                ..super::turn::Outcome::default()
            },
            Err(e) => {
                tracing::error!(session = %session.key(), word, error = %e, "a chat command failed");
                answer(crate::lang::say(
                    lang,
                    crate::lang::Msg::SettingsStoreFailed,
                    &[],
                ))
            }
        }
    }
}
