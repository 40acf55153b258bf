//! A group's own settings: what its chat admins change from the chat (`/set key value`, or
//! a button under `/settings`), inside the frame the operator's config sets
//! ([`GroupPolicy`]: defaults, caps, locked keys, the models and toolsets groups may pick).
//!
//! The group's choices are one record per chat (`group_settings`, keyed by session key)
//! holding only what its admins set; what a turn uses is [`Effective`], the operator's
//! defaults overlaid with them, locked keys and caps applied at every read (so a cap the
//! operator lowers later holds at once). Each change is written with its log entry
//! (`group_settings_log`: who, when, old → new) and the command's answer in the worker's one
//! commit; both records move with the chat when it migrates ([`SettingsHook`]). Intake reads
//! the record (reply mode, member limits) through a small cache the worker's change clears;
//! with `[cluster]` an entry lives a few seconds, since another daemon may change it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::lang::{Lang, Msg, say};
use crate::store::{KvWrite, Store, StoreError};

/// The collection of the groups' records, keyed by session key.
pub const SETTINGS_SPACE: &str = "group_settings";
/// The collection of changes, keyed `<session>|<time in ms, 13 digits>|<key>`.
pub const SETTINGS_LOG_SPACE: &str = "group_settings_log";

/// The button data prefix of a choice under `/settings`: `set:<key>:<value>`.
pub(super) const BUTTON_PREFIX: &str = "set:";

/// Most changes kept per chat; the oldest goes with the change that passes it.
const MAX_LOG: usize = 200;
/// Most cached records; past it the cache starts over (a read is one store lookup).
const MAX_CACHED: usize = 4096;
/// How long a cached record is trusted with several daemons on one store.
const CLUSTER_CACHE: Duration = Duration::from_secs(5);

/// How the bot answers in a group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplyMode {
    /// When mentioned or replied to (the default).
    #[default]
    Mention,
    /// To every message (for a small group that talks to the bot).
    All,
    /// Auto-chat: reads along in batches and speaks within its budget
    /// ([`super::auto_chat`]).
    Auto,
}

impl ReplyMode {
    /// The mode a config names (`mention`, `all`, `auto`).
    pub fn parse_config(text: &str) -> Option<ReplyMode> {
        Self::parse(text.trim())
    }

    fn parse(text: &str) -> Option<ReplyMode> {
        match text {
            "mention" => Some(ReplyMode::Mention),
            "all" | "every" | "every_message" => Some(ReplyMode::All),
            "auto" | "auto_chat" => Some(ReplyMode::Auto),
            _ => None,
        }
    }

    /// `mention`, `all`, `auto`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplyMode::Mention => "mention",
            ReplyMode::All => "all",
            ReplyMode::Auto => "auto",
        }
    }
}

/// A setting's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    /// One of the operator's named models (`[[llm.models]]`).
    Model,
    /// Extra instructions from the group, quoted as its own words.
    Persona,
    /// The toolsets the group uses, a subset of what the operator allows.
    Toolsets,
    /// [`ReplyMode`].
    ReplyMode,
    /// The language of parlor's own notices.
    Language,
    /// Turns one member may start per hour.
    MemberTurnsPerHour,
    /// Tokens one member may use per day in this group.
    MemberDailyTokens,
}

impl Key {
    /// Every key, in the order `/settings` lists them.
    pub const ALL: [Key; 7] = [
        Key::Model,
        Key::ReplyMode,
        Key::Language,
        Key::Persona,
        Key::Toolsets,
        Key::MemberTurnsPerHour,
        Key::MemberDailyTokens,
    ];

    /// Its name in commands and the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Key::Model => "model",
            Key::Persona => "persona",
            Key::Toolsets => "toolsets",
            Key::ReplyMode => "reply_mode",
            Key::Language => "language",
            Key::MemberTurnsPerHour => "member_turns_per_hour",
            Key::MemberDailyTokens => "member_daily_tokens",
        }
    }

    /// The key named `text`.
    pub fn parse(text: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

/// A group's choices: only what its admins set (`None`: the operator's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSettings {
    /// Schema version (1).
    #[serde(default)]
    pub v: u32,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolsets: Option<Vec<String>>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_mode: Option<ReplyMode>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<Lang>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_turns_per_hour: Option<u32>,
    #[allow(missing_docs)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_daily_tokens: Option<u64>,
}

/// The operator's frame for every group (`[groups]` in the config).
#[derive(Debug, Clone)]
pub struct GroupPolicy {
    /// The defaults a group starts with. `model: None` is the main model; a `None` limit
    /// is none.
    pub defaults: GroupSettings,
    /// The names of `[[llm.models]]` a group may choose.
    pub models: Vec<String>,
    /// The toolsets a group may switch on; empty: every toolset of the bot.
    pub toolsets: Vec<String>,
    /// The highest `member_turns_per_hour` a group may set (and the value for "no limit").
    pub max_member_turns_per_hour: Option<u32>,
    /// The highest `member_daily_tokens` a group may set.
    pub max_member_daily_tokens: Option<u64>,
    /// The longest persona, in characters.
    pub max_persona_chars: usize,
    /// Keys no group may change.
    pub locked: Vec<Key>,
    /// The auto-chat budget of a group whose `reply_mode` is `auto`; `None`: groups may not
    /// choose `auto` (chats the operator lists in `[[bot.auto_chat]]` still run it).
    pub auto_chat: Option<super::AutoChat>,
}

impl Default for GroupPolicy {
    fn default() -> Self {
        GroupPolicy {
            defaults: GroupSettings::default(),
            models: Vec::new(),
            toolsets: Vec::new(),
            max_member_turns_per_hour: None,
            max_member_daily_tokens: None,
            max_persona_chars: 1000,
            locked: Vec::new(),
            auto_chat: None,
        }
    }
}

/// What a chat's turns and intake use: defaults, choices, locks and caps together.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effective {
    /// The named model, `None`: the main one.
    pub model: Option<String>,
    /// The group's instructions, quoted where the model reads them.
    pub persona: Option<String>,
    /// The toolsets the chat's turns are offered; `None`: all.
    pub toolsets: Option<Vec<String>>,
    #[allow(missing_docs)]
    pub reply_mode: ReplyMode,
    #[allow(missing_docs)]
    pub language: Lang,
    #[allow(missing_docs)]
    pub member_turns_per_hour: Option<u32>,
    #[allow(missing_docs)]
    pub member_daily_tokens: Option<u64>,
}

impl GroupPolicy {
    /// What holds in a chat with `stored` choices; `listed`: the operator names the chat in
    /// `[[bot.auto_chat]]`, which makes `auto` its default reply mode.
    pub fn effective(&self, stored: &GroupSettings, listed: bool) -> Effective {
        let d = &self.defaults;
        let pick = |key: Key| !self.locked.contains(&key);
        let mut model = if pick(Key::Model) {
            stored.model.clone().or_else(|| d.model.clone())
        } else {
            d.model.clone()
        };
        // A model the operator no longer offers falls back to the default.
        if model
            .as_ref()
            .is_some_and(|m| !self.models.contains(m) && d.model.as_ref() != Some(m))
        {
            model = d.model.clone();
        }
        let default_mode = d.reply_mode.unwrap_or(if listed {
            ReplyMode::Auto
        } else {
            ReplyMode::Mention
        });
        let mut reply_mode = if pick(Key::ReplyMode) {
            stored.reply_mode.unwrap_or(default_mode)
        } else {
            default_mode
        };
        if reply_mode == ReplyMode::Auto && !listed && self.auto_chat.is_none() {
            reply_mode = ReplyMode::Mention;
        }
        let toolsets = if pick(Key::Toolsets) {
            stored.toolsets.clone().or_else(|| d.toolsets.clone())
        } else {
            d.toolsets.clone()
        }
        .map(|mut t| {
            if !self.toolsets.is_empty() {
                t.retain(|name| self.toolsets.contains(name));
            }
            t
        })
        .or_else(|| (!self.toolsets.is_empty()).then(|| self.toolsets.clone()));
        let cap_u32 = |v: Option<u32>, cap: Option<u32>| match (v, cap) {
            (Some(v), Some(cap)) => Some(v.min(cap)),
            (None, cap) => cap,
            (v, None) => v,
        };
        let cap_u64 = |v: Option<u64>, cap: Option<u64>| match (v, cap) {
            (Some(v), Some(cap)) => Some(v.min(cap)),
            (None, cap) => cap,
            (v, None) => v,
        };
        let turns = if pick(Key::MemberTurnsPerHour) {
            stored.member_turns_per_hour.or(d.member_turns_per_hour)
        } else {
            d.member_turns_per_hour
        };
        let tokens = if pick(Key::MemberDailyTokens) {
            stored.member_daily_tokens.or(d.member_daily_tokens)
        } else {
            d.member_daily_tokens
        };
        Effective {
            model,
            persona: if pick(Key::Persona) {
                stored.persona.clone().or_else(|| d.persona.clone())
            } else {
                d.persona.clone()
            },
            toolsets,
            reply_mode,
            language: if pick(Key::Language) {
                stored.language.or(d.language)
            } else {
                d.language
            }
            .unwrap_or_default(),
            member_turns_per_hour: cap_u32(turns, self.max_member_turns_per_hour),
            member_daily_tokens: cap_u64(tokens, self.max_member_daily_tokens),
        }
    }
}

/// One change, as `/settings log` and the console show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Schema version (1).
    pub v: u32,
    /// When it was made.
    pub at: DateTime<Utc>,
    /// Who made it (platform-qualified id) and their name then.
    pub by: String,
    #[allow(missing_docs)]
    pub by_name: String,
    /// The key's name.
    pub key: String,
    /// The value before and after, as `/settings` shows them.
    pub old: String,
    #[allow(missing_docs)]
    pub new: String,
}

/// The key a chat's settings are kept under: its session key without a forum topic (a
/// group's settings hold in all its topics, as its admins do).
pub fn chat_key(session: &str) -> &str {
    session.split("/topic:").next().unwrap_or(session)
}

/// The stored choices of `session` (none: the defaults).
pub fn load(store: &dyn Store, session: &str) -> Result<GroupSettings, StoreError> {
    Ok(match store.kv_get(SETTINGS_SPACE, session)? {
        Some(json) => serde_json::from_str(&json).unwrap_or_else(|e| {
            tracing::warn!(session, error = %e, "unreadable group settings; the defaults hold");
            GroupSettings::default()
        }),
        None => GroupSettings::default(),
    })
}

/// The changes of `session`, newest first, at most `limit`.
pub fn log(store: &dyn Store, session: &str, limit: usize) -> Result<Vec<Change>, StoreError> {
    let mut changes: Vec<Change> = store
        .kv_scan(SETTINGS_LOG_SPACE, &format!("{session}|"))?
        .into_iter()
        .filter_map(|(_, json)| serde_json::from_str(&json).ok())
        .collect();
    changes.reverse();
    changes.truncate(limit);
    Ok(changes)
}

/// The cache of stored choices intake reads (see the module docs).
#[derive(Default)]
pub(super) struct Cache {
    entries: Mutex<HashMap<String, (Instant, Arc<GroupSettings>)>>,
}

impl Cache {
    /// The stored choices of `session`, from the cache when fresh enough.
    pub(super) fn get(
        &self,
        store: &dyn Store,
        session: &str,
        cluster: bool,
    ) -> Arc<GroupSettings> {
        let now = Instant::now();
        let fresh = |at: Instant| !cluster || now.duration_since(at) < CLUSTER_CACHE;
        if let Some((at, settings)) = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session)
            && fresh(*at)
        {
            return Arc::clone(settings);
        }
        let settings = Arc::new(load(store, session).unwrap_or_else(|e| {
            tracing::warn!(session, error = %e, "cannot read the group's settings; the defaults hold");
            GroupSettings::default()
        }));
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_CACHED {
            entries.clear();
        }
        entries.insert(session.to_owned(), (now, Arc::clone(&settings)));
        settings
    }

    /// Forgets `session` (its record changed or moved).
    pub(super) fn forget(&self, session: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
    }
}

/// How a value reads in `/settings` and the log.
fn shown(key: Key, e: &Effective, lang: Lang) -> String {
    let none = || say(lang, Msg::SettingsNone, &[]);
    let unlimited = || say(lang, Msg::SettingsNoLimit, &[]);
    match key {
        Key::Model => e
            .model
            .clone()
            .unwrap_or_else(|| say(lang, Msg::SettingsDefault, &[])),
        Key::Persona => match &e.persona {
            Some(p) => format!("\"{}\"", crate::text::ellipsize(p, 80)),
            None => none(),
        },
        Key::Toolsets => match &e.toolsets {
            Some(t) if t.is_empty() => none(),
            Some(t) => t.join(", "),
            None => say(lang, Msg::SettingsDefault, &[]),
        },
        Key::ReplyMode => e.reply_mode.as_str().to_owned(),
        Key::Language => e.language.as_str().to_owned(),
        Key::MemberTurnsPerHour => e
            .member_turns_per_hour
            .map_or_else(unlimited, |v| v.to_string()),
        Key::MemberDailyTokens => e
            .member_daily_tokens
            .map_or_else(unlimited, |v| v.to_string()),
    }
}

/// The answer to `/settings`: every key, its value and what frames it.
pub fn settings_text(policy: &GroupPolicy, effective: &Effective) -> String {
    let lang = effective.language;
    let mut out = say(lang, Msg::SettingsHeader, &[]);
    for key in Key::ALL {
        out.push_str(&format!(
            "\n{}: {}",
            key.as_str(),
            shown(key, effective, lang)
        ));
        let mut notes = Vec::new();
        if policy.locked.contains(&key) {
            notes.push(say(lang, Msg::SettingsLocked, &[]));
        }
        let cap = match key {
            Key::MemberTurnsPerHour => policy.max_member_turns_per_hour.map(|c| c.to_string()),
            Key::MemberDailyTokens => policy.max_member_daily_tokens.map(|c| c.to_string()),
            Key::Model if !policy.models.is_empty() => Some(policy.models.join(" | ")),
            _ => None,
        };
        if let Some(cap) = cap {
            notes.push(if key == Key::Model {
                cap
            } else {
                say(lang, Msg::SettingsCap, &[("cap", &cap)])
            });
        }
        if !notes.is_empty() {
            out.push_str(&format!(" ({})", notes.join("; ")));
        }
    }
    out.push_str("\n\n");
    out.push_str(&say(lang, Msg::SettingsFooter, &[]));
    out
}

/// The buttons under `/settings`: the reply modes and languages (and models) a chat admin
/// may pick with one press.
pub fn settings_buttons(
    policy: &GroupPolicy,
    effective: &Effective,
    listed: bool,
) -> Vec<crate::platform::Button> {
    let mut buttons = Vec::new();
    let mut add = |key: Key, value: &str| {
        if !policy.locked.contains(&key) {
            buttons.push(crate::platform::Button {
                label: format!("{}: {value}", key.as_str()),
                data: format!("{BUTTON_PREFIX}{}:{value}", key.as_str()),
            });
        }
    };
    for mode in [ReplyMode::Mention, ReplyMode::All, ReplyMode::Auto] {
        let allowed = mode != ReplyMode::Auto || listed || policy.auto_chat.is_some();
        if allowed && mode != effective.reply_mode {
            add(Key::ReplyMode, mode.as_str());
        }
    }
    for lang in Lang::ALL {
        if lang != effective.language {
            add(Key::Language, lang.as_str());
        }
    }
    for model in policy.models.iter().take(3) {
        if effective.model.as_ref() != Some(model) && model.len() <= 40 {
            add(Key::Model, model);
        }
    }
    buttons.retain(|b| b.data.len() <= crate::platform::Button::MAX_DATA);
    // One row: Discord takes at most five buttons in it.
    buttons.truncate(5);
    buttons
}

/// The answer to `/settings log`.
pub fn log_text(changes: &[Change], lang: Lang) -> String {
    if changes.is_empty() {
        return say(lang, Msg::SettingsLogEmpty, &[]);
    }
    let mut out = say(lang, Msg::SettingsLogHeader, &[]);
    for c in changes {
        out.push_str(&format!(
            "\n{} {} ({}): {} {} → {}",
            c.at.format("%Y-%m-%d %H:%M UTC"),
            crate::quote::name(&c.by_name, 64),
            c.by,
            c.key,
            c.old,
            c.new
        ));
    }
    out
}

/// What `/set` asks for, checked.
pub struct Request<'a> {
    /// The chat's session key.
    pub session: &'a str,
    /// The key and value as typed.
    pub key: &'a str,
    #[allow(missing_docs)]
    pub value: &'a str,
    /// Who asks, and their name.
    pub by: &'a str,
    #[allow(missing_docs)]
    pub by_name: &'a str,
    /// When.
    pub at: DateTime<Utc>,
    /// The toolsets the bot has, for a `toolsets` value when the operator names none.
    pub all_toolsets: &'a [String],
    /// The operator names the chat in `[[bot.auto_chat]]`.
    pub listed: bool,
}

/// What a checked `/set` does: the answer, and the writes that make the change (none when
/// it is refused or changes nothing).
pub struct Applied {
    /// The answer to post.
    pub answer: String,
    /// The record and its log entry, conditional on the record read.
    pub writes: Vec<KvWrite>,
}

/// Checks `request` against `policy` and the stored record, and answers the writes that
/// make it. Pure apart from the reads; the caller commits the writes with the answer.
pub fn apply(
    store: &dyn Store,
    policy: &GroupPolicy,
    request: &Request<'_>,
) -> Result<Applied, StoreError> {
    let raw = store.kv_get(SETTINGS_SPACE, request.session)?;
    let stored: GroupSettings = raw
        .as_deref()
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    let before = policy.effective(&stored, request.listed);
    let lang = before.language;
    let refuse = |answer: String| {
        Ok(Applied {
            answer,
            writes: Vec::new(),
        })
    };
    let Some(key) = Key::parse(request.key.trim()) else {
        if request.key.trim().is_empty() {
            return refuse(say(lang, Msg::SettingsUsage, &[]));
        }
        let keys: Vec<&str> = Key::ALL.iter().map(|k| k.as_str()).collect();
        return refuse(say(
            lang,
            Msg::SettingsUnknownKey,
            &[
                ("key", &crate::quote::one_line(request.key, 40)),
                ("keys", &keys.join(", ")),
            ],
        ));
    };
    if policy.locked.contains(&key) {
        return refuse(say(
            lang,
            Msg::SettingsLockedKey,
            &[("key", key.as_str()), ("value", &shown(key, &before, lang))],
        ));
    }
    let value = request.value.trim();
    let bad = |why: String| {
        refuse(say(
            lang,
            Msg::SettingsBadValue,
            &[
                ("key", key.as_str()),
                ("value", &crate::quote::one_line(value, 60)),
                ("why", &why),
            ],
        ))
    };
    let over_cap = |cap: String| {
        refuse(say(
            lang,
            Msg::SettingsOverCap,
            &[("key", key.as_str()), ("value", value), ("cap", &cap)],
        ))
    };
    let reset = value.eq_ignore_ascii_case("default");
    let mut next = stored.clone();
    match key {
        Key::Model => {
            if reset {
                next.model = None;
            } else if policy.models.iter().any(|m| m == value) {
                next.model = Some(value.to_owned());
            } else if policy.models.is_empty() {
                return bad(say(lang, Msg::ValueNoModels, &[]));
            } else {
                return bad(say(
                    lang,
                    Msg::ValueUnknownModel,
                    &[("models", &policy.models.join(", "))],
                ));
            }
        }
        Key::Persona => {
            if reset || value.is_empty() {
                next.persona = None;
            } else if value.chars().count() > policy.max_persona_chars {
                return bad(say(
                    lang,
                    Msg::ValueTooLong,
                    &[("max", &policy.max_persona_chars.to_string())],
                ));
            } else {
                next.persona = Some(value.to_owned());
            }
        }
        Key::Toolsets => {
            let allowed: &[String] = if policy.toolsets.is_empty() {
                request.all_toolsets
            } else {
                &policy.toolsets
            };
            if reset {
                next.toolsets = None;
            } else {
                let names: Vec<String> = value
                    .split([',', ' '])
                    .map(str::trim)
                    .filter(|n| !n.is_empty() && *n != "none")
                    .map(str::to_owned)
                    .collect();
                if names.iter().any(|n| !allowed.contains(n)) {
                    return bad(say(
                        lang,
                        Msg::ValueUnknownToolsets,
                        &[("toolsets", &allowed.join(", "))],
                    ));
                }
                next.toolsets = Some(names);
            }
        }
        Key::ReplyMode => {
            if reset {
                next.reply_mode = None;
            } else {
                let Some(mode) = ReplyMode::parse(value) else {
                    return bad(say(lang, Msg::ValueUnknownMode, &[]));
                };
                if mode == ReplyMode::Auto && policy.auto_chat.is_none() && !request.listed {
                    return bad(say(lang, Msg::ValueAutoNotAllowed, &[]));
                }
                next.reply_mode = Some(mode);
            }
        }
        Key::Language => {
            if reset {
                next.language = None;
            } else {
                let Some(language) = Lang::parse(value) else {
                    return bad(say(lang, Msg::ValueUnknownLanguage, &[]));
                };
                next.language = Some(language);
            }
        }
        Key::MemberTurnsPerHour => {
            if reset {
                next.member_turns_per_hour = None;
            } else {
                let Ok(n) = value.parse::<u32>() else {
                    return bad(say(lang, Msg::ValueNotANumber, &[]));
                };
                if n == 0 {
                    return bad(say(lang, Msg::ValueAtLeastOne, &[]));
                }
                if let Some(cap) = policy.max_member_turns_per_hour.filter(|cap| n > *cap) {
                    return over_cap(cap.to_string());
                }
                next.member_turns_per_hour = Some(n);
            }
        }
        Key::MemberDailyTokens => {
            if reset {
                next.member_daily_tokens = None;
            } else {
                let Ok(n) = value.parse::<u64>() else {
                    return bad(say(lang, Msg::ValueNotANumber, &[]));
                };
                if let Some(cap) = policy.max_member_daily_tokens.filter(|cap| n > *cap) {
                    return over_cap(cap.to_string());
                }
                next.member_daily_tokens = Some(n);
            }
        }
    }
    next.v = 1;
    let after = policy.effective(&next, request.listed);
    let (old, new) = (
        shown(key, &before, lang),
        shown(key, &after, after.language),
    );
    if next == stored {
        return refuse(say(
            lang,
            Msg::SettingsUnchanged,
            &[("key", key.as_str()), ("value", &new)],
        ));
    }
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        key: request.session.to_owned(),
        reason: e.to_string(),
    };
    let json = serde_json::to_string(&next).map_err(corrupt)?;
    let change = Change {
        v: 1,
        at: request.at,
        by: request.by.to_owned(),
        by_name: request.by_name.to_owned(),
        key: key.as_str().to_owned(),
        old: old.clone(),
        new: new.clone(),
    };
    let change_json = serde_json::to_string(&change).map_err(corrupt)?;
    let mut writes = vec![
        KvWrite {
            space: SETTINGS_SPACE.to_owned(),
            key: request.session.to_owned(),
            value: Some(json),
            if_unchanged: Some(raw),
        },
        KvWrite {
            space: SETTINGS_LOG_SPACE.to_owned(),
            key: format!(
                "{}|{:013}|{}",
                request.session,
                request.at.timestamp_millis().max(0),
                key.as_str()
            ),
            value: Some(change_json),
            if_unchanged: None,
        },
    ];
    let logged = store.kv_scan(SETTINGS_LOG_SPACE, &format!("{}|", request.session))?;
    let excess = (logged.len() + 1).saturating_sub(MAX_LOG);
    writes.extend(logged.into_iter().take(excess).map(|(key, _)| KvWrite {
        space: SETTINGS_LOG_SPACE.to_owned(),
        key,
        value: None,
        if_unchanged: None,
    }));
    // The answer in the language the group has now: a change of `language` answers in it.
    Ok(Applied {
        answer: say(
            after.language,
            Msg::SettingsChanged,
            &[("key", key.as_str()), ("value", &new), ("old", &old)],
        ),
        writes,
    })
}

/// Moves a chat's record and log with it when it migrates.
pub struct SettingsHook;

impl super::ChatHook for SettingsHook {
    fn on_migrate(
        &self,
        store: &dyn Store,
        from: &crate::platform::ChatRef,
        to: &crate::platform::ChatRef,
    ) -> Result<Vec<KvWrite>, StoreError> {
        let (old, new) = (from.session_key(), to.session_key());
        let mut writes = super::move_record(store, SETTINGS_SPACE, &old, &new)?;
        writes.extend(super::move_records(
            store,
            SETTINGS_LOG_SPACE,
            &format!("{old}|"),
            &format!("{new}|"),
        )?);
        Ok(writes)
    }
}

impl super::worker::ChatWorker {
    /// `/set key value`: a chat admin (anyone in a DM) changes a setting of the chat, within
    /// the operator's frame; the change, its log entry and the answer are one commit.
    pub(super) fn set_setting(
        &self,
        session: &super::manager::Session,
        item: &super::queue::QueueItem,
    ) -> super::turn::Outcome {
        let key = chat_key(session.key());
        let lang = self.manager.effective(key).language;
        let caller = item.caller();
        let answer = |text: String| super::turn::Outcome {
            reply: Some(text),
            ..super::turn::Outcome::default()
        };
        if !item.private && caller.role < crate::tool::Role::ChatAdmin {
            return answer(say(lang, Msg::SettingsNotAdmin, &[]));
        }
        let line = item.lines.join(" ");
        let line = line.trim();
        let (name, value) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let all_toolsets: Vec<String> = self
            .manager
            .template()
            .tools()
            .toolsets()
            .iter()
            .map(|t| t.name().to_owned())
            .collect();
        let request = Request {
            session: key,
            key: name,
            value,
            by: &caller.user_id,
            by_name: &caller.name,
            at: self.manager.now(),
            all_toolsets: &all_toolsets,
            listed: super::auto_chat::listed(self.manager.config(), key),
        };
        match apply(
            self.manager.store().as_ref(),
            &self.manager.config().groups,
            &request,
        ) {
            Ok(applied) => {
                if !applied.writes.is_empty() {
                    tracing::info!(session = key, by = %caller.user_id, setting = name, "group setting changed");
                }
                super::turn::Outcome {
                    reply: Some(applied.answer),
                    also: applied.writes,
                    ..super::turn::Outcome::default()
                }
            }
            Err(e) => {
                tracing::error!(session = key, error = %e, "cannot read the group's settings");
                answer(say(lang, Msg::SettingsStoreFailed, &[]))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> GroupPolicy {
        GroupPolicy {
            models: vec!["fast".into(), "smart".into()],
            max_member_turns_per_hour: Some(20),
            locked: vec![Key::Persona],
            ..GroupPolicy::default()
        }
    }

    #[test]
    fn caps_and_locks_hold_at_every_read() {
        let stored = GroupSettings {
            member_turns_per_hour: Some(50),
            persona: Some("pirate".into()),
            model: Some("gone".into()),
            ..GroupSettings::default()
        };
        let e = policy().effective(&stored, false);
        assert_eq!(e.member_turns_per_hour, Some(20));
        assert_eq!(e.persona, None);
        assert_eq!(e.model, None);
        assert_eq!(e.reply_mode, ReplyMode::Mention);
        assert_eq!(
            policy()
                .effective(&GroupSettings::default(), true)
                .reply_mode,
            ReplyMode::Auto
        );
    }

    fn set(store: &dyn Store, policy: &GroupPolicy, key: &str, value: &str, at: i64) -> Applied {
        let request = Request {
            session: "t:-1",
            key,
            value,
            by: "t:7",
            by_name: "ann",
            at: DateTime::from_timestamp(at, 0).unwrap_or_default(),
            all_toolsets: &["time".to_owned(), "memory".to_owned()],
            listed: false,
        };
        apply(store, policy, &request).unwrap()
    }

    #[test]
    fn a_change_is_checked_then_written_with_its_log_entry_and_the_log_is_bounded() {
        let store = crate::store::MemoryStore::new();
        let policy = policy();
        let refused = [
            ("colour", "red", "There is no setting colour"),
            ("persona", "x", "locked persona"),
            ("member_turns_per_hour", "21", "the operator's cap is 20"),
            ("member_turns_per_hour", "0", "1 or more"),
            ("model", "huge", "the models are fast, smart"),
            (
                "toolsets",
                "time, shell",
                "the toolsets groups may use are time, memory",
            ),
            ("reply_mode", "auto", "not allowed auto-chat"),
            ("language", "fr", "en, zh"),
        ];
        for (key, value, said) in refused {
            let applied = set(&store, &policy, key, value, 1);
            assert!(applied.answer.contains(said), "{key}: {}", applied.answer);
            assert!(applied.writes.is_empty(), "{key}");
        }
        let applied = set(&store, &policy, "model", "smart", 1);
        assert!(
            applied.answer.contains("model is now smart (was default)"),
            "{}",
            applied.answer
        );
        store.kv_write(applied.writes).unwrap();
        assert_eq!(
            load(&store, "t:-1").unwrap().model.as_deref(),
            Some("smart")
        );
        let again = set(&store, &policy, "model", "smart", 2);
        assert!(again.answer.contains("already"), "{}", again.answer);
        for at in 0..(MAX_LOG as i64 + 5) {
            let value = if at % 2 == 0 { "12" } else { "13" };
            let applied = set(&store, &policy, "member_turns_per_hour", value, 10 + at);
            store.kv_write(applied.writes).unwrap();
        }
        let changes = log(&store, "t:-1", usize::MAX).unwrap();
        assert_eq!(changes.len(), MAX_LOG);
        assert_eq!(
            changes[0].at.timestamp(),
            10 + MAX_LOG as i64 + 4,
            "newest first"
        );
        assert_eq!(changes[0].by, "t:7");
    }
}
