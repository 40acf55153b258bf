//! The gateway loop: serenity's client in a task, messages delivered in order by one consumer.
//!
//! serenity dispatches every event on a task of its own, so its `EventHandler` only forwards
//! what it gets into a channel; one loop here converts and delivers, so a slow store slows
//! intake instead of piling up concurrent deliveries. Messages and button presses that
//! arrive together are delivered in snowflake (= time) order. A button press is the one
//! thing the handler does more for: it acknowledges the interaction before forwarding it,
//! on the event's own task, since Discord allows three seconds and the loop may be waiting
//! on the store.

use std::sync::Arc;
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::platform::{ButtonPress, ChatEvent, Delivery, Inbox, InboxError, PlatformError};
use serenity::Client;
use serenity::all::{GatewayIntents, HttpBuilder};
use serenity::client::{Context, EventHandler};
use serenity::gateway::GatewayError;
use serenity::model::application::Interaction;
use serenity::model::channel::Message;
use serenity::model::gateway::Ready;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::DiscordAdapter;
use super::convert::convert_message;
use crate::Receiver;
use crate::common::{
    DELIVERY_ATTEMPTS, DELIVERY_BACKOFF, ReadyOnce, Reconnect, Session, pause, supervise,
};

/// What the event handler forwards.
enum Item {
    Ready {
        session: String,
    },
    Resumed,
    Message(Box<Message>),
    /// A button press, already acknowledged; `id` is the interaction's.
    Press {
        id: u64,
        press: Box<ButtonPress>,
    },
}

struct Forward {
    tx: mpsc::UnboundedSender<Item>,
    /// For acknowledging presses and learning the application id.
    adapter: DiscordAdapter,
}

#[serenity::async_trait]
impl EventHandler for Forward {
    async fn message(&self, _ctx: Context, message: Message) {
        let _ = self.tx.send(Item::Message(Box::new(message)));
    }

    async fn ready(&self, _ctx: Context, ready: Ready) {
        self.adapter.learn_application(ready.application.id.get());
        let _ = self.tx.send(Item::Ready {
            session: ready.session_id,
        });
    }

    async fn interaction_create(&self, _ctx: Context, interaction: Interaction) {
        let Interaction::Component(component) = interaction else {
            return;
        };
        if let Some(press) = self.adapter.take_press(&component).await {
            let _ = self.tx.send(Item::Press {
                id: component.id.get(),
                press: Box::new(press),
            });
        }
    }

    async fn resume(&self, _ctx: Context, _event: serenity::model::event::ResumedEvent) {
        let _ = self.tx.send(Item::Resumed);
    }

    // `/readyz` follows the gateway: down while the shard reconnects or resumes.
    async fn shard_stage_update(
        &self,
        _ctx: Context,
        event: serenity::gateway::ShardStageUpdateEvent,
    ) {
        let health = parlor_bot::health::global();
        match event.new {
            serenity::gateway::ConnectionStage::Connected => health.set_ready("discord"),
            stage => health.set_down("discord", format!("gateway {stage}")),
        }
    }
}

/// What the loop delivers, in snowflake order.
enum Received {
    Message(Box<Message>),
    Press { id: u64, press: Box<ButtonPress> },
}

impl Received {
    fn id(&self) -> u64 {
        match self {
            Received::Message(message) => message.id.get(),
            Received::Press { id, .. } => *id,
        }
    }
}

/// How the gateway client is rebuilt when it stops.
const RECONNECT: Reconnect = Reconnect {
    what: "the Discord gateway",
    backoff: Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(60),
    },
    healthy_after: Duration::from_secs(60),
};

impl Receiver for DiscordAdapter {
    /// Connects to the gateway (URL from `GET /api/v10/gateway`, at `api_url` when set) and
    /// delivers every message to `inbox` until `shutdown` is cancelled, then closes the
    /// connection and returns `Ok(())`.
    ///
    /// `ready` is called once, at the first `READY` (the gateway accepted the token and the
    /// intents; messages flow from now on). serenity resumes or re-identifies by itself after
    /// a disconnect; if its client stops anyway (the gateway unreachable), it is rebuilt with
    /// backoff. Returns [`PlatformError::Unauthorized`] when the gateway rejects the token and
    /// [`PlatformError::Refused`] when the intents are not allowed (enable *Message Content
    /// Intent* in the Developer Portal). When the inbox answers `ShuttingDown` the loop stops;
    /// a store failure is retried a few times, then the message is logged as lost.
    async fn run_with_ready<R>(
        &self,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        let ready = ReadyOnce::new(ready);
        let ready = &ready;
        let inbox = &inbox;
        let config = &self.inner.config;
        let shards = config.shards.max(1);
        if !config.shard_leases.is_empty() {
            // A daemon waiting for the gateway is a standby that serves chats through the
            // store: ready all the same.
            ready.call();
        }
        let shutdown = &shutdown;
        let runs = (0..shards).map(|shard| {
            let lease = config.shard_leases.get(shard as usize).cloned();
            async move {
                supervise(&RECONNECT, lease.as_deref(), shutdown, |stop| async move {
                    self.run_client(inbox, &stop, ready, shard, shards).await
                })
                .await
            }
        });
        // One shard failing for good (a revoked token) ends them all: the others would fail
        // the same way.
        futures::future::try_join_all(runs).await.map(|_| ())
    }
}

impl DiscordAdapter {
    async fn run_client<R>(
        &self,
        inbox: &Arc<dyn Inbox>,
        shutdown: &CancellationToken,
        ready: &ReadyOnce<R>,
        shard: u32,
        shards: u32,
    ) -> Session
    where
        R: FnOnce() + Send,
    {
        let config = &self.inner.config;
        let mut http = HttpBuilder::new(self.inner.rest.token().expose());
        if let Some(url) = &config.api_url {
            // serenity honours the proxy only with its rate limiter off; parlor paces its own
            // REST calls (see `rest.rs`), serenity itself only asks for the gateway URL.
            http = http
                .proxy(url.trim().trim_end_matches('/'))
                .ratelimiter_disabled(true);
        }
        let intents = GatewayIntents::GUILD_MESSAGES
            | GatewayIntents::DIRECT_MESSAGES
            | GatewayIntents::MESSAGE_CONTENT;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let built = serenity::client::ClientBuilder::new_with_http(http.build(), intents)
            .event_handler(Forward {
                tx,
                adapter: self.clone(),
            })
            .await;
        let mut client: Client = match built {
            Ok(client) => client,
            Err(error) => {
                return Session::Unreachable(self.inner.rest.token().redact(&error.to_string()));
            }
        };
        let manager = client.shard_manager.clone();
        if shards > 1 {
            tracing::info!(shard, shards, "connecting a shard of the Discord gateway");
        }
        let mut running = tokio::spawn(async move { client.start_shard(shard, shards).await });

        let ended = loop {
            let item = tokio::select! {
                biased;
                () = shutdown.cancelled() => break Session::Shutdown,
                finished = &mut running => {
                    // Deliver what the client received before it stopped.
                    let batch: Vec<Item> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
                    if !self.handle_batch(batch, ready, inbox.as_ref(), shutdown).await {
                        break Session::Shutdown;
                    }
                    break self.client_ended(finished);
                }
                item = rx.recv() => item,
            };
            let Some(item) = item else {
                // The handler is gone: the client stopped; `running` tells why.
                break self.client_ended((&mut running).await);
            };
            // Take whatever else is already waiting, to deliver it in order.
            let mut batch = vec![item];
            batch.extend(std::iter::from_fn(|| rx.try_recv().ok()));
            if !self
                .handle_batch(batch, ready, inbox.as_ref(), shutdown)
                .await
            {
                break Session::Shutdown;
            }
        };
        // When the client already ended, its shards are gone: asking them to shut down would
        // only wait out serenity's 5 s confirmation timeout.
        if !running.is_finished() {
            manager.shutdown_all().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut running).await;
            running.abort();
        }
        ended
    }

    /// Handles forwarded items: `ready` at the first READY, messages and presses delivered
    /// in id order. False when the runtime is shutting down.
    async fn handle_batch<R>(
        &self,
        batch: Vec<Item>,
        ready: &ReadyOnce<R>,
        inbox: &dyn Inbox,
        shutdown: &CancellationToken,
    ) -> bool
    where
        R: FnOnce() + Send,
    {
        let mut received = Vec::new();
        for item in batch {
            match item {
                Item::Ready { session } => {
                    tracing::info!(session = %session, "Discord gateway ready");
                    ready.call();
                }
                Item::Resumed => tracing::info!("Discord gateway session resumed"),
                Item::Message(message) => received.push(Received::Message(message)),
                Item::Press { id, press } => received.push(Received::Press { id, press }),
            }
        }
        received.sort_by_key(Received::id);
        self.deliver_all(received, inbox, shutdown).await
    }

    fn client_ended(
        &self,
        finished: Result<Result<(), serenity::Error>, tokio::task::JoinError>,
    ) -> Session {
        match finished {
            Ok(Ok(())) => Session::Unreachable("the gateway client stopped".to_owned()),
            Ok(Err(serenity::Error::Gateway(GatewayError::InvalidAuthentication))) => {
                Session::Fatal(PlatformError::Unauthorized)
            }
            Ok(Err(serenity::Error::Gateway(
                GatewayError::DisallowedGatewayIntents | GatewayError::InvalidGatewayIntents,
            ))) => Session::Fatal(PlatformError::Refused(
                "Discord refused the gateway intents; enable the Message Content intent for \
                 the bot in the Developer Portal"
                    .to_owned(),
            )),
            Ok(Err(error)) => {
                Session::Unreachable(self.inner.rest.token().redact(&error.to_string()))
            }
            Err(join) => Session::Unreachable(format!("the gateway task ended: {join}")),
        }
    }

    /// Converts and delivers; false when the runtime is shutting down.
    async fn deliver_all(
        &self,
        received: Vec<Received>,
        inbox: &dyn Inbox,
        shutdown: &CancellationToken,
    ) -> bool {
        for item in received {
            let (id, delivery) = match item {
                Received::Message(message) => {
                    self.learn(&message);
                    let id = message.id.get();
                    if self.seen(id) {
                        continue;
                    }
                    let Some(incoming) = convert_message(&message, &self.inner.me) else {
                        continue;
                    };
                    (id, Delivery::Message(incoming))
                }
                Received::Press { id, press } => {
                    if self.seen(id) {
                        continue;
                    }
                    (id, Delivery::Event(ChatEvent::Button(*press)))
                }
            };
            if !self.deliver_one(id, delivery, inbox, shutdown).await {
                return false;
            }
        }
        true
    }

    /// Delivers one message or press, retrying a store failure a few times before logging
    /// it as lost (the gateway has no acknowledgement to withhold); false when the runtime
    /// is shutting down.
    async fn deliver_one(
        &self,
        id: u64,
        delivery: Delivery,
        inbox: &dyn Inbox,
        shutdown: &CancellationToken,
    ) -> bool {
        let chat = match &delivery {
            Delivery::Message(message) => message.chat.clone(),
            Delivery::Event(event) => event.chat().clone(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let delivered = match delivery.clone() {
                Delivery::Message(message) => inbox.deliver(message).await,
                Delivery::Event(event) => inbox.chat_event(event).await,
            };
            match delivered {
                Ok(()) => {
                    self.mark_delivered(id);
                    return true;
                }
                Err(InboxError::ShuttingDown) => return false,
                Err(InboxError::Store(error)) => {
                    if attempt >= DELIVERY_ATTEMPTS {
                        tracing::error!(%chat, id, %error, "could not store a Discord message or button press; it is lost");
                        return true;
                    }
                    let wait = DELIVERY_BACKOFF.delay(attempt - 1);
                    tracing::warn!(%chat, id, %error, ?wait, "could not store a Discord message or button press; retrying");
                    if !pause(wait, shutdown).await {
                        return false;
                    }
                }
            }
        }
    }
}
