//! Forward and reverse WebSocket: who opens the connection, and what happens between
//! connections. [`link::serve`] runs each connection once it is open.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::platform::{Delivery, Inbox, InboxError, PlatformError};
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode};
use tokio_util::sync::CancellationToken;

use super::event::Received;
use super::link::{self, Ended};
use super::{OneBotAdapter, Transport};
use crate::Receiver;
use crate::common::{
    DELIVERY_ATTEMPTS, DELIVERY_BACKOFF, ReadyOnce, Reconnect, Session, pause, supervise,
};

/// The adapter's name in `/readyz` (`parlor_bot::health`): ready while connected.
const HEALTH: &str = "onebot";

/// How the forward connection is kept up: a connection that lasted a minute was healthy, and
/// the next failure starts the backoff afresh.
const RECONNECT: Reconnect = Reconnect {
    what: "the OneBot implementation",
    backoff: Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(60),
    },
    healthy_after: Duration::from_secs(60),
};

/// The limit on a reverse connection's WebSocket handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl Receiver for OneBotAdapter {
    /// Forward: dials the implementation, serves the connection, and dials again with
    /// backoff whenever it ends; `ready` is called at the first connection. Returns
    /// [`PlatformError::Unauthorized`] when the implementation refuses the token (401/403).
    ///
    /// Reverse: listens, and serves the implementation that connects with the right token,
    /// one at a time (a newcomer is refused while a connection is served; see `accept`);
    /// `ready` is called once listening.
    /// Returns [`PlatformError::Unavailable`] when the address cannot be bound.
    ///
    /// Both return `Ok(())` at shutdown. While the inbox answers `ShuttingDown` (the
    /// runtime draining) the connection stays open, since the last replies go out over it.
    async fn run_with_ready<R>(
        &self,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        match self.inner.config.transport.clone() {
            Transport::Forward { url } => self.forward(&url, inbox, shutdown, ready).await,
            Transport::Reverse { listen } => self.reverse(listen, inbox, shutdown, ready).await,
        }
    }
}

impl OneBotAdapter {
    async fn forward<R>(
        &self,
        url: &str,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        let ready = &ReadyOnce::new(ready);
        let inbox = &inbox;
        let lease = self.inner.config.connection_lease.clone();
        if lease.is_some() {
            // A daemon waiting for the connection is a standby that serves chats through
            // the store: ready all the same.
            ready.call();
        }
        supervise(
            &RECONNECT,
            lease.as_deref(),
            &shutdown,
            |shutdown| async move {
                let ended = match self.dial(url).await {
                    Ok(ws) => {
                        tracing::info!(url, "connected to the OneBot implementation");
                        parlor_bot::health::global().set_ready(HEALTH);
                        ready.call();
                        match self.serve(ws, inbox, &shutdown).await {
                            Ended::Shutdown => return Session::Shutdown,
                            Ended::Lost(why) => Session::Dropped(why),
                        }
                    }
                    Err(Dial::Refused(status)) => {
                        tracing::error!(
                            url,
                            status,
                            "the OneBot implementation refused the access token"
                        );
                        return Session::Fatal(PlatformError::Unauthorized);
                    }
                    Err(Dial::Failed(why)) => Session::Unreachable(why),
                };
                if let Session::Dropped(why) | Session::Unreachable(why) = &ended {
                    parlor_bot::health::global().set_down(HEALTH, format!("not connected: {why}"));
                }
                ended
            },
        )
        .await
    }

    /// Opens the forward connection, with the token as `Authorization: Bearer`.
    async fn dial(
        &self,
        url: &str,
    ) -> Result<
        tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
        Dial,
    > {
        let mut request = url
            .into_client_request()
            .map_err(|e| Dial::Failed(format!("bad url: {e}")))?;
        if let Some(token) = &self.inner.token {
            let value =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    Dial::Failed("the access token cannot be sent in a header".to_owned())
                })?;
            request.headers_mut().insert("Authorization", value);
        }
        let redact = |text: String| match &self.inner.token {
            Some(token) => token.redact(&text),
            None => text,
        };
        match tokio::time::timeout(
            self.inner.config.request_timeout,
            tokio_tungstenite::connect_async(request),
        )
        .await
        {
            Ok(Ok((ws, _))) => Ok(ws),
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response)))
                if matches!(response.status().as_u16(), 401 | 403) =>
            {
                Err(Dial::Refused(response.status().as_u16()))
            }
            Ok(Err(error)) => Err(Dial::Failed(redact(error.to_string()))),
            Err(_) => Err(Dial::Failed("the connection attempt timed out".to_owned())),
        }
    }

    async fn reverse<R>(
        &self,
        listen: std::net::SocketAddr,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        let listener = TcpListener::bind(listen).await.map_err(|e| {
            PlatformError::Unavailable(format!("cannot listen for OneBot on {listen}: {e}"))
        })?;
        let bound = listener.local_addr().unwrap_or(listen);
        tracing::info!(listen = %bound, "waiting for the OneBot implementation to connect");
        ready();
        // Whether a connection is being served: while one is, a newcomer is refused.
        let slot: Arc<Mutex<bool>> = Arc::default();
        // Stops every connection when the listener stops, whatever stopped it.
        let stop_all = shutdown.child_token();
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                Some(_) = connections.join_next() => {}
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            tracing::warn!(%error, "accepting a OneBot connection failed");
                            continue;
                        }
                    };
                    let adapter = self.clone();
                    let inbox = Arc::clone(&inbox);
                    let slot = Arc::clone(&slot);
                    let stop = stop_all.child_token();
                    connections.spawn(async move {
                        adapter.accept(stream, peer, inbox, slot, stop).await
                    });
                }
            }
        }
        stop_all.cancel();
        let drained = tokio::time::timeout(Duration::from_secs(5), async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            connections.abort_all();
        }
        Ok(())
    }

    /// Shakes hands with one reverse connection and serves it. Refused before the upgrade:
    /// a request with an `Origin` (403: a browser's, which a web page can make; OneBot
    /// implementations send none), a wrong or missing token (401), and any newcomer while
    /// a connection is served (409).
    ///
    /// A newcomer never displaces the connection being served: that one may be the real
    /// implementation, and the newcomer anyone who learnt the token. A refused newcomer
    /// pings the served connection; one that is gone (half-open after a network blip, its
    /// peer reconnecting) does not answer and is dropped after [`link::PROBE_TIMEOUT`]
    /// (sooner when its heartbeats stopped), so the implementation's next attempt, a few
    /// seconds later, is taken: about 10 s plus its retry interval.
    async fn accept(
        &self,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        inbox: Arc<dyn Inbox>,
        slot: Arc<Mutex<bool>>,
        stop: CancellationToken,
    ) {
        let mut self_id: Option<String> = None;
        let mut claim: Option<Claim> = None;
        let mut busy = false;
        let token = self.inner.token.clone();
        // The handshake's callback signature is tungstenite's; its error is an HTTP answer.
        #[allow(clippy::result_large_err)]
        let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
            self_id = request
                .headers()
                .get("X-Self-ID")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let refuse = |status: StatusCode, why: &str| {
                let mut refusal = ErrorResponse::new(Some(format!("{why}\n")));
                *refusal.status_mut() = status;
                Err(refusal)
            };
            if request.headers().contains_key("Origin") {
                return refuse(StatusCode::FORBIDDEN, "browsers may not connect");
            }
            // `new` refuses a reverse config without a token; none here fails closed.
            if !token
                .as_ref()
                .is_some_and(|token| presents(request, token.expose()))
            {
                return refuse(StatusCode::UNAUTHORIZED, "wrong or missing access token");
            }
            match Claim::take(&slot) {
                Some(taken) => {
                    claim = Some(taken);
                    Ok(response)
                }
                None => {
                    busy = true;
                    refuse(
                        StatusCode::CONFLICT,
                        "another OneBot connection is being served",
                    )
                }
            }
        };
        let handshake = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_tungstenite::accept_hdr_async(stream, check),
        )
        .await;
        let ws = match handshake {
            Ok(Ok(ws)) => ws,
            Ok(Err(_)) if busy => {
                tracing::warn!(
                    %peer,
                    self_id = self_id.as_deref().unwrap_or("?"),
                    "refused a second OneBot connection: one is being served; pinging it in \
                     case it is gone"
                );
                self.inner.links.probe();
                return;
            }
            Ok(Err(error)) => {
                tracing::warn!(%peer, %error, "refused a OneBot connection");
                return;
            }
            Err(_) => {
                tracing::warn!(%peer, "a OneBot connection did not finish its handshake");
                return;
            }
        };
        // Held until the connection ends: the next one is taken only then.
        let _claim = claim;
        tracing::info!(%peer, self_id = self_id.as_deref().unwrap_or("?"), "the OneBot implementation connected");
        parlor_bot::health::global().set_ready(HEALTH);
        if let Ended::Lost(why) = self.serve(ws, &inbox, &stop).await {
            parlor_bot::health::global()
                .set_down(HEALTH, format!("the implementation disconnected: {why}"));
            tracing::warn!(%peer, error = %why, "the OneBot connection ended; waiting for it to come back");
        }
    }

    /// Serves one open connection: events into the inbox, and the account's identity
    /// asked for alongside.
    async fn serve<S>(
        &self,
        ws: tokio_tungstenite::WebSocketStream<S>,
        inbox: &Arc<dyn Inbox>,
        shutdown: &CancellationToken,
    ) -> Ended
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        // Events wait for the account's identity (or its failure), so a mention of the bot
        // reads as its nickname from the first message on; reading goes on meanwhile.
        let (known_tx, known_rx) = tokio::sync::watch::channel(false);
        let identify = async {
            match self.login_info().await {
                Ok(me) => {
                    tracing::info!(self_id = me.self_id, nickname = ?me.nickname, "logged in to QQ")
                }
                Err(error) => {
                    tracing::warn!(%error, "get_login_info failed; the bot's QQ number comes from its events")
                }
            }
            known_tx.send_replace(true);
        };
        let serving = link::serve(
            &self.inner.links,
            ws,
            self.inner.config.missed_heartbeats,
            shutdown,
            |batch| {
                let mut known = known_rx.clone();
                async move {
                    tokio::select! {
                        () = shutdown.cancelled() => return false,
                        _ = known.wait_for(|known| *known) => {}
                    }
                    self.deliver_batch(batch, inbox.as_ref(), shutdown).await
                }
            },
        );
        // The identity is asked over the connection being served, so both run at once; when
        // the connection ends, an unanswered question ends with it.
        tokio::pin!(serving, identify);
        let mut identified = false;
        loop {
            tokio::select! {
                ended = &mut serving => return ended,
                () = &mut identify, if !identified => identified = true,
            }
        }
    }

    /// Converts and delivers one batch of events; false when the runtime is shutting down.
    /// A store failure is retried a few times, then the rest of the batch is logged as lost.
    async fn deliver_batch(
        &self,
        events: Vec<Value>,
        inbox: &dyn Inbox,
        shutdown: &CancellationToken,
    ) -> bool {
        let mut batch: Vec<Delivery> = events
            .iter()
            .filter_map(|event| match self.convert(event) {
                Received::Message(converted) => Some(Delivery::Message(converted.message)),
                Received::Chat(event) => Some(Delivery::Event(*event)),
                Received::Heartbeat { .. } | Received::Own(_) | Received::Ignored => None,
            })
            .collect();
        let mut attempt = 0;
        while !batch.is_empty() {
            attempt += 1;
            let error = match inbox.deliver_all(batch.clone()).await {
                Ok(()) => return true,
                Err(error) => error,
            };
            batch.drain(..error.durable.min(batch.len()));
            match error.error {
                InboxError::ShuttingDown => return false,
                InboxError::Store(why) => {
                    if attempt >= DELIVERY_ATTEMPTS {
                        tracing::error!(lost = batch.len(), error = %why, "could not store QQ events; they are lost");
                        return true;
                    }
                    let wait = DELIVERY_BACKOFF.delay(attempt - 1);
                    tracing::warn!(left = batch.len(), error = %why, ?wait, "could not store QQ events; retrying");
                    if !pause(wait, shutdown).await {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// The one reverse connection's hold on the slot; dropping it frees the slot.
struct Claim(Arc<Mutex<bool>>);

impl Claim {
    /// The slot, unless a connection holds it.
    fn take(slot: &Arc<Mutex<bool>>) -> Option<Claim> {
        let mut taken = slot.lock().unwrap_or_else(|e| e.into_inner());
        if *taken {
            return None;
        }
        *taken = true;
        Some(Claim(Arc::clone(slot)))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = false;
    }
}

/// Why a forward connection could not be opened.
enum Dial {
    /// The implementation answered 401/403: the token is wrong.
    Refused(u16),
    Failed(String),
}

/// Whether `request` carries `token`, as `Authorization: Bearer` (or `Token`) or as the
/// `access_token` query parameter.
fn presents(request: &Request, token: &str) -> bool {
    let header = request
        .headers()
        .get("Authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("Token "))
        })
        .map(str::trim);
    let query = request.uri().query().and_then(|query| {
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key == "access_token").then_some(value)
        })
    });
    [header, query]
        .into_iter()
        .flatten()
        .any(|given| same(given.as_bytes(), token.as_bytes()))
}

/// Compares in constant time: every byte of the token is visited whatever `given` is
/// (`subtle` keeps the optimiser from stopping early), so neither how much of a guess was
/// right nor its length changes the time taken.
fn same(given: &[u8], token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let mut equal = given.len().ct_eq(&token.len());
    for (i, t) in token.iter().enumerate() {
        equal &= given.get(i).copied().unwrap_or(0).ct_eq(t);
    }
    equal.into()
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn the_token_comparison_wants_every_byte_and_the_length() {
        assert!(same(b"secret-token", b"secret-token"));
        assert!(!same(b"secret-tokex", b"secret-token"));
        assert!(!same(b"secret-toke", b"secret-token"));
        assert!(!same(b"secret-token\0", b"secret-token"));
        assert!(!same(b"", b"secret-token"));
    }
}
