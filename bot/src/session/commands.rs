//! The commands the runtime answers itself: `/help`, `/status`, `/stop` and `/reload` are
//! answered at intake (their text needs no network; the answer goes through the outbox),
//! `/reset` and `/compact` are queued for the chat's worker, which checks the sender's role
//! and carries them out. `/reload` needs an operator, which intake knows from the config alone.

use super::inbox::Intake;
use super::manager::Session;
use super::settings::Effective;
use crate::lang::{Lang, Msg, say};
use crate::tool::catalog;

/// A command of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Command {
    Help,
    Reset,
    Compact,
    Stop,
    Status,
    Reload,
    /// `/settings` (and `/settings log`): answered at intake.
    Settings,
    /// `/set key value`: queued, checked and applied by the worker.
    Set,
    /// `/approve CODE`, `/deny CODE`: decided off intake ([`super::approvals`]).
    Approve,
    /// A toolset's command ([`super::chat_commands`]); never parsed from text here.
    Toolset,
    #[allow(missing_docs)]
    Deny,
}

impl Command {
    /// `/help`, `/help@this_bot` (the adapter strips our own suffix) → a command; anything
    /// else (`/help@other_bot`, `/weather`) is not ours.
    pub(super) fn parse(text: &str) -> Option<Command> {
        let word = text.split_whitespace().next()?;
        match word {
            "/help" | "/start" => Some(Command::Help),
            "/reset" => Some(Command::Reset),
            "/compact" => Some(Command::Compact),
            "/stop" => Some(Command::Stop),
            "/status" => Some(Command::Status),
            "/reload" => Some(Command::Reload),
            "/settings" => Some(Command::Settings),
            "/set" => Some(Command::Set),
            "/approve" => Some(Command::Approve),
            "/deny" => Some(Command::Deny),
            _ => None,
        }
    }
}

/// What follows a command's word (`/compact the trip` → `the trip`), trimmed.
pub(super) fn argument(text: &str) -> &str {
    let text = text.trim_start();
    text.find(char::is_whitespace)
        .map_or("", |at| text[at..].trim())
}

impl Intake<'_> {
    /// The answer to `/help`: the commands and the tools with the role each needs.
    pub(super) fn help_text(&self, lang: Lang) -> String {
        let tools = catalog::to_help(self.manager.template().tools());
        let extra: String = self
            .manager
            .chat_commands()
            .iter()
            .map(|c| c.help(lang))
            .filter(|line| !line.is_empty())
            .map(|line| format!("\n{line}"))
            .collect();
        format!(
            "{}\n\n{}{extra}\n\n{}\n{}",
            say(lang, Msg::HelpIntro, &[]),
            say(lang, Msg::HelpCommands, &[]),
            say(lang, Msg::HelpTools, &[]),
            if tools.is_empty() {
                say(lang, Msg::SettingsNone, &[])
            } else {
                tools
            }
        )
    }

    /// The answer to `/settings` (`argument` empty) or `/settings log`.
    pub(super) fn settings_text(&self, key: &str, effective: &Effective, argument: &str) -> String {
        let store = self.manager.store().as_ref();
        if argument.trim() == "log" {
            return match super::settings::log(store, super::settings::chat_key(key), 20) {
                Ok(changes) => super::settings::log_text(&changes, effective.language),
                Err(e) => {
                    tracing::warn!(session = key, error = %e, "cannot read the settings log");
                    say(effective.language, Msg::SettingsStoreFailed, &[])
                }
            };
        }
        super::settings::settings_text(&self.manager.config().groups, effective)
    }

    /// The answer to `/status` for the chat of `key` (its live session, if any), asked by
    /// `member`.
    pub(super) fn status_text(&self, key: &str, session: Option<&Session>, member: &str) -> String {
        let (running, turns, queued) = match session {
            Some(s) => {
                let seen = s.seen();
                (seen.running, seen.turns, s.queue().len())
            }
            None => (false, 0, 0),
        };
        let history = self
            .manager
            .store()
            .load_history(key)
            .map(|h| h.len())
            .unwrap_or(0);
        let effective = self.manager.effective(key);
        let lang = effective.language;
        let summary = match self.manager.store().load_summary(key) {
            Ok(Some(s)) => say(
                lang,
                Msg::StatusSummary,
                &[
                    ("chars", &s.text.chars().count().to_string()),
                    (
                        "tokens",
                        &crate::agent::history::estimate_tokens(&crate::llm::Message::system(
                            &s.text,
                        ))
                        .to_string(),
                    ),
                    ("messages", &s.messages.to_string()),
                    ("written", &s.made.format("%Y-%m-%d %H:%M UTC").to_string()),
                ],
            ),
            Ok(None) => say(lang, Msg::SettingsNone, &[]),
            Err(_) => say(lang, Msg::StatusUnreadable, &[]),
        };
        let of = |used: u64, limit: u64| {
            say(
                lang,
                Msg::StatusOf,
                &[("used", &used.to_string()), ("limit", &limit.to_string())],
            )
        };
        let tokens = match self.manager.tokens_today(key) {
            (used, Some(limit)) => of(used, limit),
            (used, None) => used.to_string(),
        };
        let day = self.manager.usage_today(key);
        let mut cache = match day.cache_hit_percent() {
            Some(percent) => say(lang, Msg::StatusCache, &[("percent", &percent.to_string())]),
            None => say(lang, Msg::StatusNoPrompt, &[]),
        };
        if !self.manager.config().prices.is_empty() {
            cache = format!(
                "{}; {cache}",
                say(
                    lang,
                    Msg::StatusCost,
                    &[("cost", &crate::llm::price::dollars(day.cost_nanos))]
                )
            );
        }
        // The latest turn's, from its trace: a fallback's model when the primary failed.
        let answered = super::trace::recent(self.manager.store().as_ref(), key)
            .ok()
            .and_then(|traces| traces.into_iter().find_map(|t| t.model))
            .map(|model| say(lang, Msg::StatusAnsweredBy, &[("model", &model)]))
            .unwrap_or_default();
        let yours = match self.manager.member_tokens_today(member, key) {
            (used, Some(limit)) => say(
                lang,
                Msg::StatusLeft,
                &[
                    ("of", &of(used, limit)),
                    ("left", &limit.saturating_sub(used).to_string()),
                ],
            ),
            (used, None) => used.to_string(),
        };
        let mut extra = String::new();
        if let Some(limit) = effective.member_turns_per_hour {
            let used = self
                .manager
                .member_turns()
                .used(key, member, tokio::time::Instant::now());
            extra.push('\n');
            extra.push_str(&say(
                lang,
                Msg::StatusMemberTurns,
                &[("used", &used.to_string()), ("limit", &limit.to_string())],
            ));
        }
        if let Some(limit) = effective.member_daily_tokens {
            let here = super::usage::member_here(
                self.manager.store().as_ref(),
                self.manager.now().date_naive(),
                member,
                key,
            )
            .unwrap_or(0);
            extra.push('\n');
            extra.push_str(&say(
                lang,
                Msg::StatusMemberGroupTokens,
                &[("of", &of(here, limit))],
            ));
        }
        for command in self.manager.chat_commands() {
            if let Some(line) = command.status(self.manager.store().as_ref(), key, lang) {
                extra.push('\n');
                extra.push_str(&line);
            }
        }
        let model = effective
            .model
            .as_deref()
            .and_then(|name| self.manager.group_model(name))
            .map_or_else(
                || self.manager.template().config().model.clone(),
                |m| m.model.clone(),
            );
        let state = say(
            lang,
            if running {
                Msg::StatusWorking
            } else {
                Msg::StatusIdle
            },
            &[],
        );
        let body = say(
            lang,
            Msg::StatusBody,
            &[
                ("state", &state),
                ("queued", &queued.to_string()),
                ("history", &history.to_string()),
                ("summary", &summary),
                ("turns", &turns.to_string()),
                ("tokens", &tokens),
                ("cache", &cache),
                ("yours", &yours),
                ("model", &model),
                ("answered", &answered),
                (
                    "tools",
                    &self.manager.template().tools().names().len().to_string(),
                ),
                (
                    "minutes",
                    &(self.manager.started().elapsed().as_secs() / 60).to_string(),
                ),
                ("extra", &extra),
            ],
        );
        format!("Session {key}\n{body}")
    }

    /// The answer to `/reload` from `user_id`: done for an operator, refused otherwise.
    pub(super) fn reload_text(&self, user_id: &str, lang: Lang) -> String {
        if !super::policy::is_operator(self.manager.config(), user_id) {
            return say(lang, Msg::ReloadNotOperator, &[]);
        }
        let lines = self.manager.reload();
        if lines.is_empty() {
            "Reloaded: no tool loads anything from files.".to_owned()
        } else {
            format!("Reloaded.\n{}", lines.join("\n"))
        }
    }

    /// `/stop`: the answer to send and the running turn's token, to cancel once the
    /// command is recorded (a redelivered `/stop` must not cut a later turn short).
    pub(super) fn stop(
        &self,
        session: Option<&Session>,
        lang: Lang,
    ) -> (String, Option<tokio_util::sync::CancellationToken>) {
        match session.and_then(|s| s.running()) {
            Some(token) => (say(lang, Msg::Stopped, &[]), Some(token)),
            None => (say(lang, Msg::NothingToStop, &[]), None),
        }
    }
}
