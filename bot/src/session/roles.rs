//! Roles, resolved where waiting is harmless, and only when they matter. Operators come
//! from the config at intake; chat admins from the platform's list of the chat's
//! administrators, cached per chat with a timeout on the lookup, so one slow platform call
//! stalls only the chat that needs it. A single sender's turn does not look them up
//! first: most turns call no tool a member may not, and a lookup before each new chat's
//! first turn costs a platform round trip (20–100 ms) the reply waits for. The turn's
//! [`TurnRoles`] answers when a tool needs more than a member ([`ToolContext::role_here`]).
//! Inputs whose role decides before any tool runs are resolved in the worker: `/reset`, and
//! merged inputs of several senders (they act with the least role of all).
//!
//! [`ToolContext::role_here`]: crate::tool::ToolContext::role_here

use std::time::Duration;

use async_trait::async_trait;
// tokio's clock, so the cache follows paused time in tests.
use tokio::time::Instant;

use super::input::RoleLookup;
use super::manager::SessionManager;
use super::policy::is_operator;
use super::queue::QueueItem;
use super::worker::ChatWorker;
use crate::platform::ChatRef;
use crate::tool::{Role, RoleError, RoleResolver};

/// How long reading a chat's administrators may take.
const ADMINS_TIMEOUT: Duration = Duration::from_secs(10);

impl ChatWorker {
    /// The caller roles of a queued item, completed where they decide before a tool runs
    /// (see the module docs): intake only knows operators, so for `/reset` and merged
    /// input every other caller of a group chat is looked up here. A lookup that fails
    /// leaves a member.
    pub(super) async fn resolve_roles(&self, item: &mut QueueItem) {
        let on_demand = match item.kind.rules().roles {
            // An auto-chat turn runs as a member whoever wrote the messages (`auto_chat.rs`).
            RoleLookup::Never => return,
            // `/reset` and `/compact` are refused to members: the role decides first.
            RoleLookup::First => false,
            RoleLookup::OnDemand => item.callers.len() == 1,
        };
        for caller in &mut item.callers {
            // A stored role is from when the input arrived; after a restart the config may
            // have changed, so an operator is checked again.
            if caller.role == Role::Operator && !is_operator(self.manager.config(), &caller.user_id)
            {
                caller.role = Role::Member;
            }
            if on_demand || caller.role != Role::Member || caller.user_id.is_empty() || item.private
            {
                continue;
            }
            match self.manager.role_in(&caller.user_id, &item.chat).await {
                Ok(role) => caller.role = role,
                Err(e) => {
                    tracing::warn!(chat = %item.chat, error = %e, "treating the sender as a member")
                }
            }
        }
    }
}

/// The chat's administrators, from the cache or the platform.
async fn chat_admins(manager: &SessionManager, chat: &ChatRef) -> Result<Vec<String>, RoleError> {
    // Admins are per chat, not per forum topic.
    let key = format!("{}:{}", chat.platform, chat.chat_id);
    let ttl = manager.config().admin_cache_ttl;
    let cached = manager
        .admin_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .filter(|(at, _)| at.elapsed() < ttl)
        .map(|(_, ids)| ids.clone());
    if let Some(ids) = cached {
        return Ok(ids);
    }
    let unavailable = |reason: String| RoleError::Unavailable {
        chat: chat.to_string(),
        reason,
    };
    let Some(platform) = manager.platform(chat) else {
        return Err(unavailable(format!("no adapter serves {}", chat.platform)));
    };
    let ids = match tokio::time::timeout(ADMINS_TIMEOUT, platform.chat_admins(chat)).await {
        Ok(Ok(ids)) => ids,
        Ok(Err(e)) => return Err(unavailable(e.to_string())),
        Err(_) => return Err(unavailable("the lookup timed out".to_owned())),
    };
    let mut cache = manager
        .admin_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // Where the table would grow (a cost in proportion to its size anyway), the expired
    // lookups go first: one of every chat ever seen would otherwise stay for good.
    if cache.len() >= cache.capacity() {
        cache.retain(|_, (at, _)| at.elapsed() < ttl);
        if let Some(to) = super::dispatcher::shrunk_capacity(cache.len(), cache.capacity()) {
            cache.shrink_to(to);
        }
    }
    cache.insert(key, (Instant::now(), ids.clone()));
    Ok(ids)
}

#[async_trait]
impl RoleResolver for SessionManager {
    async fn role_in(&self, user_id: &str, chat: &ChatRef) -> Result<Role, RoleError> {
        if is_operator(self.config(), user_id) {
            return Ok(Role::Operator);
        }
        if user_id.is_empty() {
            return Ok(Role::Member);
        }
        let admins = chat_admins(self, chat).await?;
        Ok(if admins.iter().any(|a| a == user_id) {
            Role::ChatAdmin
        } else {
            Role::Member
        })
    }
}

/// The roles a turn's tools may ask about: the manager's, except that in the turn's own
/// chat when it is a direct message nobody is a chat admin (and the platform is not asked).
pub(super) struct TurnRoles {
    pub(super) manager: SessionManager,
    pub(super) chat: ChatRef,
    pub(super) private: bool,
}

#[async_trait]
impl RoleResolver for TurnRoles {
    async fn role_in(&self, user_id: &str, chat: &ChatRef) -> Result<Role, RoleError> {
        let here = chat.platform == self.chat.platform && chat.chat_id == self.chat.chat_id;
        if here && self.private {
            return Ok(if is_operator(self.manager.config(), user_id) {
                Role::Operator
            } else {
                Role::Member
            });
        }
        self.manager.role_in(user_id, chat).await
    }
}
