//! What each kind of input may do, in one table: merging, where it waits, whose rights its
//! turn holds, how its text reads, whether it posts. A new [`PendingKind`] is added here and
//! at the place that creates it; every other session file asks [`PendingKind::rules`].

use crate::store::PendingKind;

/// The rules of one kind of input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputRules {
    /// What its turn does.
    pub action: Action,
    /// Whether an input arriving while the chat is busy merges into a waiting one of the
    /// same kind (a burst of mentions becomes one turn).
    pub merges: bool,
    /// Where it waits for its turn.
    pub waits: Wait,
    /// Whose rights the turn holds.
    pub caller: CallerRule,
    /// How the turn's input text is made from the item's lines.
    pub text: TextRule,
    /// When the senders' chat roles are looked up on the platform.
    pub roles: RoleLookup,
    /// Whether the turn's answer is posted and the chat sees typing and notices from it. A
    /// auto-chat turn speaks only through `send_message`, within its limits.
    pub posts: bool,
    /// Whether starting its turn counts against the chat's turns per minute.
    pub rate_limited: bool,
}

/// What the turn of an input does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// An agent turn, within the chat's daily budget.
    Turn,
    /// `/reset`: the conversation and everything queued before it go.
    Reset,
    /// `/compact [topic]`: the older turns are summarized.
    Compact,
    /// `/set key value`: a group setting changes.
    Settings,
    /// A toolset's command ([`super::chat_commands`]).
    ChatCommand,
}

/// Where an input waits for its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// At the back of the chat's queue; refused (the sender told) when it is full.
    Queue,
    /// At the back of the queue even when it is full: its number is bounded by the tasks a
    /// chat may hold, not by what members send.
    QueueOverCapacity,
    /// At the front of the queue: it decides what happens to everything behind it.
    QueueFront,
    /// In the auto-chat batch beside the queue: a mention never waits behind chatter.
    Batch,
}

/// Whose rights a turn holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerRule {
    /// The sender's, or for a merged burst the least role of all senders.
    Senders,
    /// Nobody is there to see it: no chat admin's or operator's rights, only what the work
    /// itself asked for (`queue::unattended_caller`).
    Unattended,
    /// A member's, whoever wrote the messages (`auto_chat::auto_chat_caller`).
    AutoChat,
}

/// How a turn's input text is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextRule {
    /// Every line, in arrival order.
    Lines,
    /// The lines quoted as unaddressed chatter (`auto_chat::input_text`).
    AutoChat,
}

/// When a turn's senders' chat roles are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleLookup {
    /// Never: the caller rule fixes the role.
    Never,
    /// Before the turn: the role decides whether it runs at all.
    First,
    /// When a gated tool asks, for one sender; before the turn for a merged burst (its role
    /// is the least of all).
    OnDemand,
}

impl PendingKind {
    /// The rules of this kind of input.
    pub const fn rules(self) -> InputRules {
        const TURN: InputRules = InputRules {
            action: Action::Turn,
            merges: false,
            waits: Wait::Queue,
            caller: CallerRule::Senders,
            text: TextRule::Lines,
            roles: RoleLookup::OnDemand,
            posts: true,
            rate_limited: true,
        };
        match self {
            PendingKind::UserMessage => InputRules {
                merges: true,
                ..TURN
            },
            PendingKind::TaskResult => InputRules {
                merges: true,
                waits: Wait::QueueOverCapacity,
                caller: CallerRule::Unattended,
                ..TURN
            },
            PendingKind::ClockFire => InputRules {
                waits: Wait::QueueOverCapacity,
                caller: CallerRule::Unattended,
                ..TURN
            },
            PendingKind::AutoChat => InputRules {
                waits: Wait::Batch,
                caller: CallerRule::AutoChat,
                text: TextRule::AutoChat,
                roles: RoleLookup::Never,
                posts: false,
                ..TURN
            },
            PendingKind::Reset => InputRules {
                action: Action::Reset,
                waits: Wait::QueueFront,
                roles: RoleLookup::First,
                rate_limited: false,
                ..TURN
            },
            PendingKind::Compact => InputRules {
                action: Action::Compact,
                roles: RoleLookup::First,
                ..TURN
            },
            PendingKind::ChatCommand => InputRules {
                action: Action::ChatCommand,
                roles: RoleLookup::First,
                rate_limited: false,
                ..TURN
            },
            PendingKind::Settings => InputRules {
                action: Action::Settings,
                roles: RoleLookup::First,
                rate_limited: false,
                ..TURN
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unattended_inputs_never_hold_a_senders_rights_and_auto_chat_ones_never_post() {
        for kind in [PendingKind::TaskResult, PendingKind::ClockFire] {
            assert_eq!(kind.rules().caller, CallerRule::Unattended);
        }
        let quiet = PendingKind::AutoChat.rules();
        assert!(!quiet.posts);
        assert_eq!(quiet.caller, CallerRule::AutoChat);
        assert_eq!(quiet.roles, RoleLookup::Never);
    }
}
