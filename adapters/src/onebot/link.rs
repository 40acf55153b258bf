//! The connection to the implementation, whichever side opened it: actions out as requests
//! with an `echo` that their answers carry back, events in, and the heartbeat watch.
//!
//! [`Links`] holds the live connection's outgoing queue and the actions waiting for their
//! answers. [`serve`] runs one WebSocket until it ends: a pump that reads frames (answers go
//! straight to their waiting action, events into a bounded queue), writes queued actions
//! and watches heartbeats, beside a deliverer that hands the queued events to the inbox in
//! order. Both live in the caller's task; nothing is spawned here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{SinkExt, Stream, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

use super::error::OneBotError;
use super::event::int;

/// Actions queued for the writer of one connection.
const OUTGOING_CAPACITY: usize = 64;

/// Events read but not yet delivered: when the store is slow, reading pauses here (the
/// implementation buffers) rather than holding events without bound.
pub(crate) const EVENT_QUEUE: usize = 256;

/// How long a frame may take to be written before the connection counts as dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection has to answer a [`Links::probe`] ping (with a pong or any frame)
/// before it counts as gone. A half-open connection (the peer vanished without a FIN)
/// accepts writes into its socket buffer for minutes; only a missing answer shows it.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may stay without any frame from the implementation before it is
/// pinged. Heartbeats can be turned off, and a peer that vanished without a FIN (a NAT
/// dropping the flow, a frozen process) would otherwise never be noticed on a quiet
/// connection: it is now, within this plus [`PROBE_TIMEOUT`].
pub(crate) const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);

/// The live connection, as the senders see it.
#[derive(Clone)]
struct Handle {
    id: u64,
    tx: mpsc::Sender<Message>,
}

/// The actions' way to the implementation.
pub(crate) struct Links {
    current: watch::Sender<Option<Handle>>,
    /// echo -> (connection id, where its answer goes).
    waiting: Mutex<HashMap<String, (u64, oneshot::Sender<Value>)>>,
    next: AtomicU64,
}

impl Links {
    pub(crate) fn new() -> Links {
        Links {
            current: watch::channel(None).0,
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, oneshot::Sender<Value>)>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `tx` the connection actions go through; returns its id.
    fn install(&self, tx: mpsc::Sender<Message>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.current.send_replace(Some(Handle { id, tx }));
        id
    }

    /// Forgets connection `id` (if still current) and fails the actions waiting on it.
    fn remove(&self, id: u64) {
        self.current.send_if_modified(|current| {
            if current.as_ref().is_some_and(|h| h.id == id) {
                *current = None;
                true
            } else {
                false
            }
        });
        // Dropping the senders tells each waiting action its connection is gone.
        self.waiting().retain(|_, (link, _)| *link != id);
    }

    /// Whether a connection is up.
    pub(crate) fn connected(&self) -> bool {
        self.current.borrow().is_some()
    }

    /// Pings the live connection: unless some frame comes back within [`PROBE_TIMEOUT`],
    /// its [`serve`] ends it as lost. Does nothing when none is up or its queue is full (a
    /// full queue is being written, and a stuck write ends it on its own).
    pub(crate) fn probe(&self) {
        if let Some(handle) = self.current.borrow().as_ref() {
            let _ = handle.tx.try_send(Message::Ping(Vec::new()));
        }
    }

    /// Runs `action` with `params` on the live connection (waiting for one, within
    /// `timeout`) and returns its `data`. A `retcode` other than 0 is
    /// [`OneBotError::Action`].
    pub(crate) async fn call(
        &self,
        action: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, OneBotError> {
        let deadline = Instant::now() + timeout;
        let timed_out = || OneBotError::Timeout {
            action: action.to_owned(),
            timeout,
        };
        let mut current = self.current.subscribe();
        let handle =
            match tokio::time::timeout_at(deadline, current.wait_for(Option::is_some)).await {
                Ok(Ok(handle)) => handle.clone(),
                _ => return Err(OneBotError::NotConnected),
            };
        let Some(handle) = handle else {
            return Err(OneBotError::NotConnected);
        };
        let echo = format!("parlor:{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (answer_tx, answer_rx) = oneshot::channel();
        self.waiting().insert(echo.clone(), (handle.id, answer_tx));
        // Forgets the entry however this call ends (answered, timed out, cancelled).
        let _forget = Forget {
            links: self,
            echo: &echo,
        };
        let request = json!({"action": action, "params": params, "echo": echo});
        match tokio::time::timeout_at(deadline, handle.tx.send(Message::Text(request.to_string())))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(OneBotError::Dropped(action.to_owned())),
            Err(_) => return Err(timed_out()),
        }
        let answer = match tokio::time::timeout_at(deadline, answer_rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => return Err(OneBotError::Dropped(action.to_owned())),
            Err(_) => return Err(timed_out()),
        };
        let retcode = int(answer.get("retcode")).unwrap_or(0);
        let status = answer.get("status").and_then(Value::as_str);
        // retcode 1 with status `async`: accepted, to be done later.
        let accepted = retcode == 0 || (retcode == 1 && status == Some("async"));
        if !accepted || status == Some("failed") {
            let message = ["wording", "message", "msg"]
                .iter()
                .find_map(|key| {
                    answer
                        .get(*key)
                        .and_then(Value::as_str)
                        .filter(|m| !m.is_empty())
                })
                .unwrap_or("no reason given")
                .to_owned();
            return Err(OneBotError::Action {
                action: action.to_owned(),
                retcode,
                message,
            });
        }
        Ok(answer.get("data").cloned().unwrap_or(Value::Null))
    }

    /// Hands an answer to its action; false when nothing waits for it (an answer that
    /// came too late, or to someone else's echo).
    fn answer(&self, echo: &str, answer: Value) -> bool {
        match self.waiting().remove(echo) {
            Some((_, tx)) => tx.send(answer).is_ok(),
            None => false,
        }
    }
}

struct Forget<'a> {
    links: &'a Links,
    echo: &'a str,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.links.waiting().remove(self.echo);
    }
}

/// How a connection ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// Shutdown.
    Shutdown,
    /// The connection is gone (closed, broken, or silent past its heartbeats).
    Lost(String),
}

/// Serves one connection until it ends or `shutdown`: see the module's doc. `deliver` takes
/// the events in order, in batches of what is already queued; it answers false when the
/// runtime stops taking them, and later events are dropped (the connection stays up for
/// the draining runtime's sends).
pub(crate) async fn serve<S, D, F>(
    links: &Links,
    ws: WebSocketStream<S>,
    missed_heartbeats: u32,
    shutdown: &CancellationToken,
    mut deliver: D,
) -> Ended
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    D: FnMut(Vec<Value>) -> F,
    F: Future<Output = bool>,
{
    let (mut sink, mut source) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(OUTGOING_CAPACITY);
    let id = links.install(tx);
    let (events_tx, mut events_rx) = mpsc::channel::<Value>(EVENT_QUEUE);
    let stop = shutdown.child_token();

    let pump = async {
        let mut silence: Option<Duration> = None;
        let mut last_frame = Instant::now();
        // When an unanswered probe ping makes the connection count as gone.
        let mut probe_due: Option<Instant> = None;
        let ended = loop {
            let watchdog = async {
                match silence {
                    Some(limit) => tokio::time::sleep_until(last_frame + limit).await,
                    None => std::future::pending().await,
                }
            };
            let unanswered = async {
                match probe_due {
                    Some(due) => tokio::time::sleep_until(due).await,
                    None => std::future::pending().await,
                }
            };
            let quiet = async {
                match probe_due {
                    None => tokio::time::sleep_until(last_frame + KEEPALIVE_IDLE).await,
                    Some(_) => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = stop.cancelled() => break Ended::Shutdown,
                () = watchdog => break Ended::Lost(format!(
                    "no frame for {:?} though heartbeats were due", silence.unwrap_or_default()
                )),
                () = unanswered => break Ended::Lost(format!(
                    "no answer to a ping within {PROBE_TIMEOUT:?}"
                )),
                () = quiet => {
                    probe_due = Some(Instant::now() + PROBE_TIMEOUT);
                    match tokio::time::timeout(WRITE_TIMEOUT, sink.send(Message::Ping(Vec::new()))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => break Ended::Lost(format!("write failed: {error}")),
                        Err(_) => break Ended::Lost("a write did not finish".to_owned()),
                    }
                }
                out = rx.recv() => {
                    let Some(out) = out else { break Ended::Lost("replaced".to_owned()) };
                    if matches!(out, Message::Ping(_)) && probe_due.is_none() {
                        probe_due = Some(Instant::now() + PROBE_TIMEOUT);
                    }
                    match tokio::time::timeout(WRITE_TIMEOUT, sink.send(out)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => break Ended::Lost(format!("write failed: {error}")),
                        Err(_) => break Ended::Lost("a write did not finish".to_owned()),
                    }
                }
                frame = next_text(&mut source) => {
                    let frame = match frame {
                        Ok(frame) => frame,
                        Err(why) => break Ended::Lost(why),
                    };
                    // Any frame (a pong included) shows the peer is there.
                    last_frame = Instant::now();
                    probe_due = None;
                    let Some(text) = frame else { continue };
                    let Ok(value) = serde_json::from_str::<Value>(&text) else {
                        tracing::debug!(frame = %parlor_bot::text::split_chars(&text, 200).0, "not JSON; ignored");
                        continue;
                    };
                    if value.get("post_type").is_none() {
                        if let Some(echo) = value.get("echo").and_then(Value::as_str)
                            && !links.answer(echo, value.clone())
                        {
                            tracing::debug!(echo, "an answer nothing waits for");
                        }
                        continue;
                    }
                    if value.get("meta_event_type").and_then(Value::as_str) == Some("heartbeat") {
                        let interval = int(value.get("interval")).and_then(|i| u64::try_from(i).ok());
                        silence = interval
                            .filter(|&ms| ms > 0)
                            .map(|ms| Duration::from_millis(ms) * missed_heartbeats.max(1));
                        continue;
                    }
                    tokio::select! {
                        biased;
                        () = stop.cancelled() => break Ended::Shutdown,
                        sent = events_tx.send(value) => if sent.is_err() { break Ended::Shutdown },
                    }
                }
            }
        };
        links.remove(id);
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        drop(events_tx);
        ended
    };

    let deliverer = async {
        // Events already read are delivered even when the connection is gone: the
        // implementation will not send them again.
        let mut taking = true;
        let mut refused = 0usize;
        loop {
            let first = tokio::select! {
                biased;
                () = stop.cancelled() => break,
                first = events_rx.recv() => first,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while batch.len() < EVENT_QUEUE
                && let Ok(more) = events_rx.try_recv()
            {
                batch.push(more);
            }
            // Once the runtime stops taking events it is draining, and its last replies go
            // out over this very connection: the connection stays open (reading their
            // answers) until `shutdown` ends it, and what arrives later is dropped.
            if !taking {
                refused += batch.len();
                continue;
            }
            taking = deliver(batch).await;
        }
        if refused > 0 {
            tracing::warn!(
                refused,
                "QQ events arrived while the daemon was shutting down and were not taken"
            );
        }
    };

    let (ended, ()) = tokio::join!(pump, deliverer);
    ended
}

/// The next text frame; `Ok(None)` for frames that carry none (pings, pongs); `Err` when
/// the connection is over.
async fn next_text<S>(source: &mut S) -> Result<Option<String>, String>
where
    S: Stream<Item = Result<Message, WsError>> + Unpin,
{
    match source.next().await {
        None => Err("the connection closed".to_owned()),
        Some(Err(error)) => Err(format!("the connection broke: {error}")),
        Some(Ok(Message::Text(text))) => Ok(Some(text)),
        Some(Ok(Message::Binary(bytes))) => Ok(String::from_utf8(bytes).ok()),
        Some(Ok(Message::Close(frame))) => Err(format!(
            "closed by the implementation{}",
            frame
                .map(|f| format!(": {} {}", f.code, f.reason))
                .unwrap_or_default()
        )),
        Some(Ok(_)) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::DuplexStream;
    use tokio_tungstenite::tungstenite::protocol::Role;

    use super::*;

    async fn client(io: DuplexStream) -> WebSocketStream<DuplexStream> {
        WebSocketStream::from_raw_socket(io, Role::Client, None).await
    }

    /// A peer that vanished without closing (nothing reads its end, nothing answers) and
    /// sent no heartbeats: the quiet connection is pinged, and the missing answer ends it.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_whose_peer_is_gone_is_found_lost() {
        let (ours, _theirs) = tokio::io::duplex(64 * 1024);
        let links = Links::new();
        let shutdown = CancellationToken::new();
        let started = Instant::now();
        let ended = serve(&links, client(ours).await, 3, &shutdown, |_| async { true }).await;
        let Ended::Lost(why) = ended else {
            panic!("ended as {ended:?}");
        };
        assert!(why.contains("no answer to a ping"), "{why}");
        assert_eq!(started.elapsed(), KEEPALIVE_IDLE + PROBE_TIMEOUT);
    }

    /// A peer that is there answers the pings (its WebSocket does, with pongs): the quiet
    /// connection stays up until shutdown.
    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_whose_peer_answers_pings_stays_up() {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        let peer = tokio::spawn(async move {
            let mut ws = WebSocketStream::from_raw_socket(theirs, Role::Server, None).await;
            let mut pings = 0u32;
            while let Some(Ok(frame)) = ws.next().await {
                pings += u32::from(matches!(frame, Message::Ping(_)));
            }
            pings
        });
        let links = Links::new();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let quiet_for = KEEPALIVE_IDLE * 10;
        tokio::spawn(async move {
            tokio::time::sleep(quiet_for).await;
            stop.cancel();
        });
        let ended = serve(&links, client(ours).await, 3, &shutdown, |_| async { true }).await;
        assert!(matches!(ended, Ended::Shutdown), "ended as {ended:?}");
        let pings = peer.await.unwrap();
        assert!(pings >= 9, "{pings} pings in {quiet_for:?}");
    }
}
