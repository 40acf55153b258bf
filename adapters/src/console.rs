//! The console adapter behind `parlor chat`: one group chat played in a terminal. Each input
//! line is a message from a member — `alice: hi @parlor` speaks as alice, a line without a
//! `name:` prefix speaks as the default member — and the bot's replies are printed. It runs
//! the same sessions, store and tools as the daemon, so it is the way to try parlor without
//! a platform account.
//!
//! Group rules apply as on Telegram: a line is addressed to the bot when it mentions
//! `@<bot name>`, starts with `>` (a reply to the bot's last message) or is a command. In
//! direct mode (`parlor chat --dm`) every line is addressed.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Utc;
use parlor_bot::platform::{
    ChatKind, ChatRef, ImageRef, Inbox, InboxError, IncomingMessage, Platform, PlatformError,
    Sender, SentMessage,
};
use parlor_bot::time::WallTime;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};
use tokio_util::sync::CancellationToken;

/// The platform name, and so the session key prefix (`console:local`).
pub const PLATFORM: &str = "console";

/// How the console chat behaves.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// The chat id (`local` gives the session `console:local`).
    pub chat_id: String,
    /// The bot's name, as members mention it (`@parlor`).
    pub bot_name: String,
    /// Who speaks when a line has no `name:` prefix.
    pub default_speaker: String,
    /// Direct-message mode: every line is addressed to the bot.
    pub direct: bool,
}

impl Default for ConsoleOptions {
    fn default() -> Self {
        ConsoleOptions {
            chat_id: "local".to_owned(),
            bot_name: "parlor".to_owned(),
            default_speaker: "you".to_owned(),
            direct: false,
        }
    }
}

/// Where replies are printed; shared between the platform and the input loop.
type Output = Arc<Mutex<Box<dyn Write + Send>>>;

/// The console as a [`Platform`]: replies are printed to the output.
#[derive(Clone)]
pub struct ConsolePlatform {
    out: Output,
    bot_name: String,
    /// Ids of printed replies, so `>` can reply to the last one.
    last_sent: Arc<Mutex<Option<String>>>,
    next_id: Arc<AtomicU64>,
    /// Message ids are prefixed with the start time: a restarted console on the same store
    /// must not reuse ids that the inbound dedupe has already seen.
    run_id: i64,
    /// Where a typed line's time is read: the console is its own platform, so the time a
    /// line arrives is the message's time.
    wall: WallTime,
}

impl std::fmt::Debug for ConsolePlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsolePlatform")
            .field("bot_name", &self.bot_name)
            .finish_non_exhaustive()
    }
}

impl ConsolePlatform {
    /// A console printing to `out`.
    pub fn new(out: Box<dyn Write + Send>, bot_name: &str) -> Self {
        ConsolePlatform {
            out: Arc::new(Mutex::new(out)),
            bot_name: bot_name.to_owned(),
            last_sent: Arc::default(),
            next_id: Arc::new(AtomicU64::new(1)),
            // A run's id only needs to differ from earlier runs', so the system clock is
            // right here whatever wall time the rest reads.
            run_id: Utc::now().timestamp_millis(),
            wall: WallTime::system(),
        }
    }

    /// Stamps typed lines with `wall`'s time rather than the system clock's.
    pub fn with_wall_time(mut self, wall: WallTime) -> Self {
        self.wall = wall;
        self
    }

    fn next_id(&self) -> String {
        format!(
            "{}-{}",
            self.run_id,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn print(&self, text: &str) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        // A closed terminal is not worth failing a turn for.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

#[async_trait]
impl Platform for ConsolePlatform {
    fn name(&self) -> &str {
        PLATFORM
    }

    async fn send(
        &self,
        _chat: &ChatRef,
        text: &str,
        _reply_to: Option<&str>,
        _key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        if !sent.is_empty() {
            // One part only: a retry of a printed line prints nothing more.
            return Ok(SentMessage {
                message_ids: sent.clone(),
            });
        }
        let id = self.next_id();
        // Markdown as a terminal shows it best: bullets, aligned tables, links with URLs.
        let rendered = parlor_render::plain::render(text);
        self.print(&format!("{}: {}", self.bot_name, rendered.trim_end()));
        *self.last_sent.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.clone());
        sent.push(id);
        Ok(SentMessage {
            message_ids: sent.clone(),
        })
    }

    async fn send_typing(&self, _chat: &ChatRef) -> Result<(), PlatformError> {
        Ok(())
    }

    async fn chat_admins(&self, _chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        Ok(Vec::new())
    }

    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        Err(PlatformError::NotFound(format!(
            "the console has no file {}",
            image.file_id
        )))
    }
}

/// Splits `alice: hi` into (`alice`, `hi`); a line without a one-word prefix has no speaker.
fn split_speaker(line: &str) -> (Option<&str>, &str) {
    if let Some((name, rest)) = line.split_once(':') {
        let name = name.trim();
        let is_name = (1..=32).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '-');
        // `/cmd: x` or a URL (`http://...`) is text, not a speaker.
        if is_name && !rest.starts_with("//") {
            return (Some(name), rest.trim_start());
        }
    }
    (None, line)
}

/// Turns one input line into a message of the console chat; `None` for a blank line.
pub fn parse_line(
    line: &str,
    options: &ConsoleOptions,
    platform: &ConsolePlatform,
) -> Option<IncomingMessage> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    let (speaker, text) = split_speaker(line);
    let speaker = speaker.unwrap_or(&options.default_speaker);
    let (text, reply_to) = match text.strip_prefix('>') {
        Some(rest) => (
            rest.trim_start(),
            platform
                .last_sent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        ),
        None => (text, None),
    };
    let mention = format!("@{}", options.bot_name.to_lowercase());
    Some(IncomingMessage {
        chat: ChatRef::new(PLATFORM, &options.chat_id),
        kind: if options.direct {
            ChatKind::Private
        } else {
            ChatKind::Group
        },
        message_id: platform.next_id(),
        sender: Sender {
            id: format!("{PLATFORM}:{speaker}"),
            name: speaker.to_owned(),
            username: Some(speaker.to_owned()),
            is_bot: false,
        },
        text: text.to_owned(),
        time: platform.wall.now(),
        reply_to_bot: reply_to.is_some(),
        reply_to,
        mentions_bot: text.to_lowercase().contains(&mention),
        images: Vec::new(),
    })
}

/// Reads lines from `input` until it ends (or `shutdown`), delivering each to `inbox`.
/// Returns when the input is exhausted; the caller decides how long to wait for answers.
pub async fn run<R: AsyncBufRead + Unpin>(
    input: R,
    inbox: Arc<dyn Inbox>,
    platform: ConsolePlatform,
    options: ConsoleOptions,
    shutdown: CancellationToken,
) -> Result<(), InboxError> {
    let mut lines = input.lines();
    loop {
        let line = tokio::select! {
            line = lines.next_line() => line,
            () = shutdown.cancelled() => return Ok(()),
        };
        let line = match line {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the console input");
                return Ok(());
            }
        };
        if let Some(message) = parse_line(&line, &options, &platform) {
            inbox.deliver(message).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn platform() -> ConsolePlatform {
        ConsolePlatform::new(Box::new(std::io::sink()), "parlor")
    }

    #[test]
    fn lines_name_their_speaker_and_mentions_are_seen() {
        let p = platform();
        let o = ConsoleOptions::default();
        let m = parse_line("alice: hi @Parlor", &o, &p).unwrap();
        assert_eq!(m.sender.id, "console:alice");
        assert_eq!(m.text, "hi @Parlor");
        assert!(m.mentions_bot);
        assert_eq!(m.chat.session_key(), "console:local");
        assert_eq!(m.kind, ChatKind::Group);

        let m = parse_line("just talking", &o, &p).unwrap();
        assert_eq!(m.sender.name, "you");
        assert!(!m.mentions_bot);

        let m = parse_line("see https://example.com", &o, &p).unwrap();
        assert_eq!(m.sender.name, "you");
        assert!(parse_line("   ", &o, &p).is_none());
    }

    #[tokio::test]
    async fn a_quote_line_replies_to_the_last_bot_message() {
        let p = platform();
        let sent = p
            .send(
                &ChatRef::new(PLATFORM, "local"),
                "hello",
                None,
                None,
                &mut Vec::new(),
            )
            .await
            .unwrap();
        let m = parse_line("bob: > and then?", &ConsoleOptions::default(), &p).unwrap();
        assert!(m.reply_to_bot);
        assert_eq!(m.reply_to.as_deref(), Some(sent.message_ids[0].as_str()));
        assert_eq!(m.text, "and then?");
    }

    #[test]
    fn ids_are_unique_across_restarts() {
        let a = platform().next_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = platform().next_id();
        assert_ne!(a, b);
    }
}
