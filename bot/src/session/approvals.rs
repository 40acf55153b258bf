//! Approvals ([`crate::tool::approval`]) as the session layer keeps them: a request is a
//! record (`approvals`, keyed `<session>|<code>`) written in one transaction with the post
//! that asks for it (buttons where the platform has them, `/approve CODE` / `/deny CODE`
//! everywhere); the turn waits on the record. A decision comes in at intake (a command or a
//! button press), which records it and hands it to a task of its own: the decider's role
//! may need the platform (chat admins), and intake never waits on the network. The task
//! checks the role, writes the decision conditionally on the record it read (two presses
//! cannot both decide), posts who decided, and wakes the turn; a daemon whose turn waits
//! for a decision taken by another daemon reads it at its next poll.
//!
//! After a restart the input's turn runs again and the model may ask for the same call: a
//! record of the same session, tool and arguments from within the approval timeout answers
//! it (still waiting: wait on; approved and not yet run: run once; run already: refused, so
//! a kill between the run and the turn's commit never runs it twice; denied or expired:
//! that). Approving marks the record run in the same write that lets it run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::inbox::{Accepted, Intake};
use super::manager::SessionManager;
use crate::lang::{Lang, Msg, say};
use crate::platform::{Button, ButtonPress, ChatRef, InboxError, IncomingMessage, Sender};
use crate::store::{KvWrite, OutboxEntry, StoreError, StoredMessage, TurnCommit};
use crate::tool::approval::{Approval, ApprovalRequest, Approver};
use crate::tool::{Role, RoleResolver};

/// The collection of requests.
pub const APPROVALS_SPACE: &str = "approvals";
/// How often a waiting turn reads its record again, for a decision another daemon took.
const POLL: Duration = Duration::from_secs(2);
/// Most decisions being checked at once; past it a decision is refused as busy.
const MAX_DECIDING: usize = 64;
/// Longest the role lookup of a decision may take.
const ROLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest the arguments shown in the request post, in characters.
const SHOWN_ARGUMENTS: usize = 600;
/// The button data prefix of a decision: `ap:<code>:y` or `ap:<code>:n`.
pub(super) const BUTTON_PREFIX: &str = "ap:";

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Nobody decided yet.
    Waiting,
    /// Someone said yes; `ran` tells whether the tool was let run.
    Approved,
    /// Someone said no.
    Denied,
    /// Nobody decided in time.
    Expired,
}

/// One request, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Schema version (1).
    pub v: u32,
    /// What people type: `/approve <code>`.
    pub code: String,
    /// The session and chat of the turn.
    pub session: String,
    #[allow(missing_docs)]
    pub chat: ChatRef,
    /// The tool and its arguments (compact JSON).
    pub tool: String,
    #[allow(missing_docs)]
    pub arguments: String,
    /// The role a decider needs.
    pub role: Role,
    /// Who the call was for.
    pub asked_by: String,
    #[allow(missing_docs)]
    pub asked_by_name: String,
    /// When it was asked, and until when it waits.
    pub created: DateTime<Utc>,
    #[allow(missing_docs)]
    pub expires: DateTime<Utc>,
    #[allow(missing_docs)]
    pub state: State,
    /// Who decided (name and id), and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub decided_by_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[allow(missing_docs)]
    pub decided_at: Option<DateTime<Utc>>,
    /// Whether the approved tool was let run.
    #[serde(default)]
    pub ran: bool,
}

fn record_key(session: &str, code: &str) -> String {
    format!("{session}|{code}")
}

fn corrupt(key: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt {
        key: key.to_owned(),
        reason: e.to_string(),
    }
}

fn role_text(role: Role, lang: Lang) -> String {
    say(
        lang,
        if role >= Role::Operator {
            Msg::ApprovalRoleOperator
        } else {
            Msg::ApprovalRoleChatAdmin
        },
        &[],
    )
}

/// A code people can type: the reserved id in base 36.
fn code_of(id: u64) -> String {
    const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut n = id;
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    while out.len() < 4 {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The turn's approver: see the module docs.
pub(super) struct TurnApprover {
    pub(super) manager: SessionManager,
    pub(super) session: String,
    pub(super) chat: ChatRef,
    pub(super) lang: Lang,
}

#[async_trait]
impl Approver for TurnApprover {
    async fn approve(&self, request: ApprovalRequest<'_>, cancel: &CancellationToken) -> Approval {
        match self.ask(request, cancel).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(session = %self.session, tool = request.tool, error = %e, "cannot keep the approval request");
                Approval::Unavailable("the store failed".to_owned())
            }
        }
    }
}

impl TurnApprover {
    fn timeout(&self) -> Duration {
        self.manager.config().approval_timeout
    }

    fn minutes(&self) -> u64 {
        self.timeout().as_secs().div_ceil(60).max(1)
    }

    /// An earlier request of this session for the same call, still standing.
    fn earlier(&self, tool: &str, arguments: &str) -> Result<Option<(String, Record)>, StoreError> {
        let now = self.manager.now();
        let window = chrono::Duration::from_std(self.timeout()).unwrap_or_default();
        let store = self.manager.store();
        let mut found = None;
        for (key, json) in store.kv_scan(APPROVALS_SPACE, &format!("{}|", self.session))? {
            let Ok(record) = serde_json::from_str::<Record>(&json) else {
                continue;
            };
            if record.tool == tool
                && record.arguments == arguments
                && record.created + window + window >= now
            {
                found = Some((json, record));
            } else if record.expires + chrono::Duration::days(1) < now {
                // Long over: nothing will read it again.
                let _ = store.kv_delete(APPROVALS_SPACE, &key);
            }
        }
        Ok(found)
    }

    async fn ask(
        &self,
        request: ApprovalRequest<'_>,
        cancel: &CancellationToken,
    ) -> Result<Approval, StoreError> {
        let arguments =
            serde_json::to_string(request.arguments).map_err(|e| corrupt(request.tool, e))?;
        let record = match self.earlier(request.tool, &arguments)? {
            Some((raw, record)) => match self.answer_of(&record, raw)? {
                Some(answer) => return Ok(answer),
                None => record,
            },
            None => self.post_request(request, arguments).await?,
        };
        self.wait(record, cancel).await
    }

    /// What a stored record answers by itself (`None`: it waits still). An approval not yet
    /// used is marked run here, in the write that lets the tool run.
    fn answer_of(&self, record: &Record, raw: String) -> Result<Option<Approval>, StoreError> {
        let by = || record.decided_by.clone().unwrap_or_default();
        Ok(Some(match record.state {
            State::Waiting if record.expires > self.manager.now() => return Ok(None),
            State::Waiting | State::Expired => {
                if record.state == State::Waiting {
                    self.rewrite(record, raw, |r| r.state = State::Expired)?;
                }
                Approval::Expired {
                    minutes: self.minutes(),
                }
            }
            State::Denied => Approval::Denied { by: by() },
            State::Approved if record.ran => Approval::AlreadyRan,
            State::Approved => {
                self.rewrite(record, raw, |r| r.ran = true)?;
                Approval::Approved { by: by() }
            }
        }))
    }

    /// Writes `record` changed by `change`, only if it is still `raw`.
    fn rewrite(
        &self,
        record: &Record,
        raw: String,
        change: impl FnOnce(&mut Record),
    ) -> Result<(), StoreError> {
        let key = record_key(&record.session, &record.code);
        let mut next = record.clone();
        change(&mut next);
        let json = serde_json::to_string(&next).map_err(|e| corrupt(&key, e))?;
        self.manager.store().kv_write(vec![KvWrite {
            space: APPROVALS_SPACE.to_owned(),
            key,
            value: Some(json),
            if_unchanged: Some(Some(raw)),
        }])
    }

    /// Stores a new request with the post that asks for it, in one transaction.
    async fn post_request(
        &self,
        request: ApprovalRequest<'_>,
        arguments: String,
    ) -> Result<Record, StoreError> {
        let manager = &self.manager;
        let store = manager.store();
        let code = code_of(store.reserve_id()?);
        let now = manager.now();
        let record = Record {
            v: 1,
            code: code.clone(),
            session: self.session.clone(),
            chat: self.chat.clone(),
            tool: request.tool.to_owned(),
            arguments,
            role: request.role,
            asked_by: request.caller.user_id.clone(),
            asked_by_name: request.caller.name.clone(),
            created: now,
            expires: now + chrono::Duration::from_std(self.timeout()).unwrap_or_default(),
            state: State::Waiting,
            decided_by: None,
            decided_by_id: None,
            decided_at: None,
            ran: false,
        };
        let key = record_key(&self.session, &code);
        let json = serde_json::to_string(&record).map_err(|e| corrupt(&key, e))?;
        let who = if request.caller.user_id.is_empty() {
            "a scheduled task".to_owned()
        } else {
            format!(
                "{} ({})",
                crate::quote::name(&request.caller.name, 64),
                request.caller.user_id
            )
        };
        let shown = crate::text::ellipsize(&record.arguments, SHOWN_ARGUMENTS);
        let text = say(
            self.lang,
            Msg::ApprovalAsk,
            &[
                ("who", &who),
                ("tool", request.tool),
                (
                    "arguments",
                    &format!("```\n{}\n```", shown.replace("```", "'''")),
                ),
                ("role", &role_text(request.role, self.lang)),
                ("code", &code),
                ("minutes", &self.minutes().to_string()),
            ],
        );
        let buttons = vec![
            Button {
                label: say(self.lang, Msg::ApprovalApproveButton, &[]),
                data: format!("{BUTTON_PREFIX}{code}:y"),
            },
            Button {
                label: say(self.lang, Msg::ApprovalDenyButton, &[]),
                data: format!("{BUTTON_PREFIX}{code}:n"),
            },
        ];
        let entry =
            OutboxEntry::new(&self.session, &self.chat, text, None, now).with_buttons(buttons);
        let mut also = vec![KvWrite {
            space: APPROVALS_SPACE.to_owned(),
            key,
            value: Some(json),
            if_unchanged: Some(None),
        }];
        // With `[cluster]`: asked only while this daemon holds the chat.
        match manager.dispatcher().fence(manager, &self.session) {
            Ok(fence) => also.extend(fence),
            Err(super::dispatcher::Lost) => {
                return Err(StoreError::Changed(format!(
                    "the lease of {}",
                    self.session
                )));
            }
        }
        post_with(manager, entry, also).await?;
        tracing::info!(session = %self.session, tool = request.tool, code, "a tool call waits for approval");
        Ok(record)
    }

    /// Waits until `record` is decided, expires, or the turn stops.
    async fn wait(
        &self,
        record: Record,
        cancel: &CancellationToken,
    ) -> Result<Approval, StoreError> {
        let manager = &self.manager;
        let key = record_key(&record.session, &record.code);
        let notify = manager.approval_waiter(&key);
        let answer = loop {
            let notified = notify.notified();
            let Some(raw) = manager.store().kv_get(APPROVALS_SPACE, &key)? else {
                break Approval::Unavailable("the request's record is gone".to_owned());
            };
            let current: Record = serde_json::from_str(&raw).map_err(|e| corrupt(&key, e))?;
            if let Some(answer) = self.answer_of(&current, raw)? {
                break answer;
            }
            let left = (current.expires - manager.now())
                .to_std()
                .unwrap_or_default();
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(left.min(POLL)) => {}
                () = cancel.cancelled() => break Approval::Cancelled,
            }
        };
        manager.approval_done(&key);
        tracing::info!(session = %self.session, code = %record.code, ?answer, "approval answered");
        Ok(answer)
    }
}

/// A decision to check off intake.
struct Decision {
    chat: ChatRef,
    code: String,
    approve: bool,
    sender: Sender,
    /// The command's message, answered in the chat; `None` for a button.
    message_id: Option<String>,
    /// The button press, answered to the presser alone.
    press: Option<ButtonPress>,
    lang: Lang,
}

impl Intake<'_> {
    /// `/approve CODE` or `/deny CODE`: the message is recorded, the decision checked by
    /// its own task ([`decide`]).
    pub(super) fn decide_by_command(
        &self,
        message: &IncomingMessage,
        stored: &StoredMessage,
        approve: bool,
        code: String,
        lang: Lang,
    ) -> Result<Accepted, InboxError> {
        let key = message.chat.session_key();
        let code = code.trim().to_uppercase();
        if code.is_empty() || code.len() > 16 || !code.chars().all(|c| c.is_ascii_alphanumeric()) {
            let answer = OutboxEntry::new(
                &key,
                &message.chat,
                say(lang, Msg::ApprovalUsage, &[]),
                Some(message.message_id.clone()),
                self.manager.now(),
            );
            return self.record_and_answer(&key, stored, answer);
        }
        match self
            .manager
            .store()
            .record_inbound(&key, stored, crate::store::Intake::Record)
            .map_err(|e| InboxError::Store(e.to_string()))?
        {
            crate::store::Inbound::Duplicate => return Ok(Accepted::durable()),
            crate::store::Inbound::Recorded(_) => {}
        }
        spawn_decision(
            self.manager,
            Decision {
                chat: message.chat.clone(),
                code,
                approve,
                sender: message.sender.clone(),
                message_id: Some(message.message_id.clone()),
                press: None,
                lang,
            },
        );
        Ok(Accepted::durable())
    }

    /// A press of an Approve or Deny button (`ap:<code>:y|n`); `false` when `press` is not
    /// one.
    pub(super) fn decide_by_button(&self, press: &ButtonPress) -> bool {
        let Some(rest) = press.data.strip_prefix(BUTTON_PREFIX) else {
            return false;
        };
        let Some((code, yes)) = rest.rsplit_once(':') else {
            return false;
        };
        let lang = self.manager.effective(&press.chat.session_key()).language;
        spawn_decision(
            self.manager,
            Decision {
                chat: press.chat.clone(),
                code: code.to_uppercase(),
                approve: yes == "y",
                sender: press.sender.clone(),
                message_id: None,
                press: Some(press.clone()),
                lang,
            },
        );
        true
    }
}

/// Starts the task of `decision`, or refuses it when too many are being checked.
fn spawn_decision(manager: &SessionManager, decision: Decision) {
    let Ok(permit) = Arc::clone(manager.deciding()).try_acquire_owned() else {
        tracing::warn!(chat = %decision.chat, "too many approval decisions at once; one refused");
        return;
    };
    let task = {
        let manager = manager.clone();
        async move {
            let _permit = permit;
            decide(&manager, decision).await;
        }
    };
    manager.tracker().spawn(task);
}

/// Checks and applies one decision; see the module docs.
async fn decide(manager: &SessionManager, decision: Decision) {
    let session = decision.chat.session_key();
    let key = record_key(&session, &decision.code);
    let lang = decision.lang;
    let reply = |text: String| async {
        match &decision.press {
            Some(press) => answer_press(manager, press, Some(&text)).await,
            None => post(manager, &decision, text).await,
        }
    };
    let read = || -> Result<Option<(String, Record)>, StoreError> {
        let Some(raw) = manager.store().kv_get(APPROVALS_SPACE, &key)? else {
            return Ok(None);
        };
        let record = serde_json::from_str(&raw).map_err(|e| corrupt(&key, e))?;
        Ok(Some((raw, record)))
    };
    let (raw, record) = match read() {
        Ok(Some(found)) => found,
        Ok(None) => {
            return reply(say(lang, Msg::ApprovalUnknown, &[("code", &decision.code)])).await;
        }
        Err(e) => {
            tracing::error!(session, error = %e, "cannot read an approval request");
            return reply(say(lang, Msg::SettingsStoreFailed, &[])).await;
        }
    };
    if record.state != State::Waiting || record.expires <= manager.now() {
        return reply(already(&record, lang)).await;
    }
    let role = if super::policy::is_operator(manager.config(), &decision.sender.id) {
        Role::Operator
    } else if decision.chat.platform == "console" || decision.sender.id.is_empty() {
        Role::Member
    } else {
        match tokio::time::timeout(
            ROLE_TIMEOUT,
            manager.role_in(&decision.sender.id, &decision.chat),
        )
        .await
        {
            Ok(Ok(role)) => role,
            Ok(Err(e)) => {
                tracing::warn!(session, error = %e, "cannot tell the decider's role; refused");
                Role::Member
            }
            Err(_) => Role::Member,
        }
    };
    if role < record.role {
        tracing::info!(session, code = %decision.code, by = %decision.sender.id, "approval decision refused: role too low");
        return reply(say(
            lang,
            Msg::ApprovalNotAllowed,
            &[("role", &role_text(record.role, lang))],
        ))
        .await;
    }
    let name = crate::quote::name(&decision.sender.name, 64);
    let mut next = record.clone();
    next.state = if decision.approve {
        State::Approved
    } else {
        State::Denied
    };
    next.decided_by = Some(name.clone());
    next.decided_by_id = Some(decision.sender.id.clone());
    next.decided_at = Some(manager.now());
    let Ok(json) = serde_json::to_string(&next) else {
        return;
    };
    let told = say(
        lang,
        if decision.approve {
            Msg::ApprovalApproved
        } else {
            Msg::ApprovalDenied
        },
        &[
            ("tool", &record.tool),
            ("code", &record.code),
            ("who", &name),
        ],
    );
    let entry = OutboxEntry::new(
        &session,
        &decision.chat,
        told,
        decision.message_id.clone(),
        manager.now(),
    );
    let decided = KvWrite {
        space: APPROVALS_SPACE.to_owned(),
        key: key.clone(),
        value: Some(json),
        if_unchanged: Some(Some(raw)),
    };
    match post_with(manager, entry, vec![decided]).await {
        Ok(()) => {}
        Err(StoreError::Changed(_)) => {
            // Someone else decided first.
            let text = match read() {
                Ok(Some((_, now))) => already(&now, lang),
                _ => say(lang, Msg::ApprovalUnknown, &[("code", &decision.code)]),
            };
            return reply(text).await;
        }
        Err(e) => {
            tracing::error!(session, error = %e, "cannot record an approval decision");
            return reply(say(lang, Msg::SettingsStoreFailed, &[])).await;
        }
    }
    tracing::info!(session, code = %decision.code, by = %decision.sender.id, approve = decision.approve, "approval decided");
    manager.approval_decided(&key);
    if let Some(press) = &decision.press {
        answer_press(manager, press, None).await;
    }
}

fn already(record: &Record, lang: Lang) -> String {
    let state = match record.state {
        State::Approved => Msg::ApprovalStateApproved,
        State::Denied => Msg::ApprovalStateDenied,
        State::Waiting | State::Expired => Msg::ApprovalStateExpired,
    };
    say(
        lang,
        Msg::ApprovalAlreadyDecided,
        &[("code", &record.code), ("state", &say(lang, state, &[]))],
    )
}

/// Answers a press on its platform (only the presser sees `text`).
pub(super) async fn answer_press(
    manager: &SessionManager,
    press: &ButtonPress,
    text: Option<&str>,
) {
    let Some(platform) = manager.platform(&press.chat) else {
        return;
    };
    match tokio::time::timeout(Duration::from_secs(10), platform.answer_button(press, text)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(chat = %press.chat, error = %e, "cannot answer a button press")
        }
        Err(_) => tracing::warn!(chat = %press.chat, "answering a button press timed out"),
    }
}

/// Posts `text` in the decision's chat, as a reply to its command, through the outbox.
async fn post(manager: &SessionManager, decision: &Decision, text: String) {
    let entry = OutboxEntry::new(
        &decision.chat.session_key(),
        &decision.chat,
        text,
        decision.message_id.clone(),
        manager.now(),
    );
    if let Err(e) = post_with(manager, entry, Vec::new()).await {
        tracing::error!(chat = %decision.chat, error = %e, "cannot post an approval answer");
    }
}

/// Writes `entry` with `also` in one transaction, waits until it is durable, and hands it
/// to its chat's outbox lane.
async fn post_with(
    manager: &SessionManager,
    mut entry: OutboxEntry,
    also: Vec<KvWrite>,
) -> Result<(), StoreError> {
    let id = manager.store().commit_turn(TurnCommit {
        session: entry.session.clone(),
        history: None,
        answered: Vec::new(),
        reply: Some(entry.clone()),
        summary: None,
        also,
    })?;
    manager.durable().await?;
    if let Some(id) = id {
        entry.id = id;
        manager.enqueue_reply(entry, Vec::new());
    }
    Ok(())
}

/// The waiters of this daemon's turns, by record key.
#[derive(Default)]
pub(super) struct Waiters {
    waiting: std::sync::Mutex<HashMap<String, Arc<Notify>>>,
}

impl Waiters {
    pub(super) fn waiter(&self, key: &str) -> Arc<Notify> {
        Arc::clone(
            self.waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.to_owned())
                .or_default(),
        )
    }

    pub(super) fn done(&self, key: &str) {
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    pub(super) fn wake(&self, key: &str) {
        if let Some(notify) = self
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
        {
            notify.notify_waiters();
        }
    }
}

/// How many decisions may be checked at once.
pub(super) fn deciding() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_DECIDING))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_short_and_distinct() {
        assert_eq!(code_of(0), "0000");
        assert_eq!(code_of(35), "000Z");
        assert_eq!(code_of(36), "0010");
        assert_ne!(code_of(1_000_001), code_of(1_000_002));
    }
}
