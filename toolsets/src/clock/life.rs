//! The clock's part in a chat's life ([`ChatHook`]), applied in the event's one store
//! transaction:
//! - a chat moves to a new id (a group upgraded to a supergroup): every task firing into it
//!   fires into the new id, and every task created in it counts as created in the new one;
//! - the bot is removed from a chat: every enabled task firing into it (any topic) is
//!   paused, with the reason in `paused_reason` (shown by `clock_get` and `clock_list`),
//!   and its creator is told in the chat the task was created in. The session layer posts
//!   that notice only into a chat other than the removed one that the bot is still in, and
//!   logs it otherwise. `clock_update` with `enabled: true` resumes a task (and clears the
//!   reason) once the bot is back.
//!
//! The writes are answered through [`ClockHandle`], which notes them so that its index of
//! the enabled tasks follows once the event's transaction has landed. Each is conditional
//! on the record the hook read, so a fire that advanced a task meanwhile is never undone
//! (which after a move would fire it again): the transaction is refused and the session
//! layer asks the hook again.

use parlor_bot::platform::ChatRef;
use parlor_bot::session::{ChatHook, Removal};
use parlor_bot::store::{KvWrite, Store, StoreError};

use super::handle::ClockHandle;
use super::task::ClockTask;

/// The clock's [`ChatHook`]: register it with
/// [`SessionManager::add_chat_hook`](parlor_bot::session::SessionManager::add_chat_hook).
#[derive(Debug, Clone)]
pub struct ClockChatHook {
    handle: ClockHandle,
}

impl ClockChatHook {
    /// The hook over the tasks of `handle`.
    pub fn new(handle: ClockHandle) -> Self {
        ClockChatHook { handle }
    }

    fn tasks(&self) -> Result<Vec<(ClockTask, String)>, StoreError> {
        self.handle
            .tasks_as_read()
            .map_err(|e| StoreError::Io(format!("cannot read the clock tasks: {e}")))
    }
}

fn same_chat(a: &ChatRef, b: &ChatRef) -> bool {
    a.platform == b.platform && a.chat_id == b.chat_id
}

impl ChatHook for ClockChatHook {
    fn on_migrate(
        &self,
        _store: &dyn Store,
        from: &ChatRef,
        to: &ChatRef,
    ) -> Result<Vec<KvWrite>, StoreError> {
        let old = from.session_key();
        let mut moved = Vec::new();
        for (mut task, read) in self.tasks()? {
            let retarget = same_chat(&task.target, from);
            let rehome = task.created_in == old;
            if !retarget && !rehome {
                continue;
            }
            if retarget {
                task.target = ChatRef {
                    thread_id: task.target.thread_id.take(),
                    ..to.clone()
                };
            }
            if rehome {
                task.created_in = to.session_key();
            }
            moved.push((task, read));
        }
        // Through the handle, so its index follows once the event's transaction landed.
        Ok(self.handle.hook_writes(&moved))
    }

    fn on_removed(
        &self,
        _store: &dyn Store,
        chat: &ChatRef,
        status: &str,
    ) -> Result<Removal, StoreError> {
        let now = self.handle.now();
        let mut removal = Removal::default();
        let mut paused = Vec::new();
        for (mut task, read) in self.tasks()? {
            if !task.enabled || !same_chat(&task.target, chat) {
                continue;
            }
            let reason = format!(
                "the bot was removed from {} ({status}) at {}",
                task.target,
                now.to_rfc3339()
            );
            task.enabled = false;
            task.next_fire = None;
            task.paused_reason = Some(reason.clone());
            task.updated_at = now;
            if let Some(home) = ChatRef::parse_session_key(&task.created_in) {
                let creator = if task.creator.name.is_empty() {
                    task.creator.user_id.clone()
                } else {
                    task.creator.name.clone()
                };
                removal.notices.push((
                    home,
                    format!(
                        "Clock task #{} \"{}\" (created by {creator}) is paused: {reason}. \
                         An admin can enable it again with clock_update once the bot is back.",
                        task.id, task.name
                    ),
                ));
            }
            tracing::info!(clock = task.id, chat = %chat, status, "clock task paused: the bot was removed");
            paused.push((task, read));
        }
        removal.writes = self.handle.hook_writes(&paused);
        Ok(removal)
    }
}
