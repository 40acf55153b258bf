//! The one way in for input no member typed: a clock task's fire and a background job's
//! notice (a terminal task, a sub-agent).
//!
//! The channel is made first, before the services that send on it and before the
//! [`SessionManager`] that serves it, so nothing has to be bound late: the clock, the
//! terminal and the sub-agents hold a [`SystemInputs`] (no reference to the sessions), and
//! the manager takes the [`SystemReceiver`] in [`SessionManager::serve_system`] after
//! [`SessionManager::resume`]. Until then a request waits in the bounded channel: what the
//! store held at the start is queued first, and a fire or notice arriving meanwhile is
//! stored and queued after it, once, under its own new pending id.

use tokio::sync::{mpsc, oneshot};

use super::manager::{SessionManager, SubmitError};
use super::queue::ScheduledOutcome;
use crate::platform::ChatRef;
use crate::store::KvWrite;
use crate::tool::Caller;

/// Requests a channel holds before a sender waits; the services that send time out on
/// their side (a clock fire is then logged failed, a notice is given up and logged).
pub const SYSTEM_INPUT_CAPACITY: usize = 256;

/// One request to the session layer.
enum Request {
    Notice {
        chat: ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
        reply: oneshot::Sender<Result<u64, SubmitError>>,
    },
    Withdraw {
        chat: ChatRef,
        pending_id: u64,
        reply: oneshot::Sender<Result<bool, SubmitError>>,
    },
    ClockFire {
        chat: ChatRef,
        text: String,
        caller: Caller,
        reply: oneshot::Sender<Result<oneshot::Receiver<ScheduledOutcome>, SubmitError>>,
    },
}

/// The sending side: cheap to clone, held by the clock, the terminal and the sub-agents.
#[derive(Clone, Debug)]
pub struct SystemInputs {
    tx: mpsc::Sender<Request>,
}

/// The receiving side, served by [`SessionManager::serve_system`].
pub struct SystemReceiver {
    rx: mpsc::Receiver<Request>,
}

impl std::fmt::Debug for SystemReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemReceiver").finish_non_exhaustive()
    }
}

/// A new channel for system inputs.
pub fn system_inputs() -> (SystemInputs, SystemReceiver) {
    let (tx, rx) = mpsc::channel(SYSTEM_INPUT_CAPACITY);
    (SystemInputs { tx }, SystemReceiver { rx })
}

impl SystemInputs {
    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<Result<T, SubmitError>>) -> Request,
    ) -> Result<T, SubmitError> {
        let (reply, answer) = oneshot::channel();
        // A closed channel or a dropped reply both mean the session layer has stopped.
        self.tx
            .send(request(reply))
            .await
            .map_err(|_| SubmitError::ShuttingDown)?;
        answer.await.map_err(|_| SubmitError::ShuttingDown)?
    }

    /// Queues a background job's notice for `chat`, stored with `also` in one transaction
    /// ([`SessionManager::submit_notice`]); returns its pending id once it is durable.
    pub async fn notice(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
        also: Vec<KvWrite>,
    ) -> Result<u64, SubmitError> {
        let chat = chat.clone();
        self.ask(|reply| Request::Notice {
            chat,
            text,
            caller,
            also,
            reply,
        })
        .await
    }

    /// Withdraws a queued notice that has not started its turn
    /// ([`SessionManager::withdraw`]). Requests are served in order, so a notice sent
    /// before is always seen.
    pub async fn withdraw(&self, chat: &ChatRef, pending_id: u64) -> Result<bool, SubmitError> {
        let chat = chat.clone();
        self.ask(|reply| Request::Withdraw {
            chat,
            pending_id,
            reply,
        })
        .await
    }

    /// Queues a clock task's fire for `chat` ([`SessionManager::submit_scheduled`]);
    /// returns where its outcome arrives.
    pub async fn clock_fire(
        &self,
        chat: &ChatRef,
        text: String,
        caller: Caller,
    ) -> Result<oneshot::Receiver<ScheduledOutcome>, SubmitError> {
        let chat = chat.clone();
        self.ask(|reply| Request::ClockFire {
            chat,
            text,
            caller,
            reply,
        })
        .await
    }
}

/// Serves system inputs until shutdown begins, on `manager`'s task tracker (see
/// [`SessionManager::serve_system`]).
pub(super) fn serve(manager: &SessionManager, receiver: SystemReceiver) {
    let mut rx = receiver.rx;
    let tracker = manager.tracker().clone();
    let manager = manager.clone();
    tracker.spawn(async move {
        loop {
            let request = tokio::select! {
                request = rx.recv() => request,
                () = manager.draining().cancelled() => None,
            };
            let Some(request) = request else { break };
            // One at a time, in order: each answer is durable before the next request
            // is read, so a withdraw always sees the notice sent before it.
            serve_request(&manager, request).await;
        }
        rx.close();
        while let Ok(request) = rx.try_recv() {
            refuse(request);
        }
    });
}

async fn serve_request(manager: &SessionManager, request: Request) {
    match request {
        Request::Notice {
            chat,
            text,
            caller,
            also,
            reply,
        } => {
            let _ = reply.send(manager.submit_notice(&chat, text, caller, also).await);
        }
        Request::Withdraw {
            chat,
            pending_id,
            reply,
        } => {
            let _ = reply.send(manager.withdraw(&chat, pending_id));
        }
        Request::ClockFire {
            chat,
            text,
            caller,
            reply,
        } => {
            let _ = reply.send(manager.submit_scheduled(&chat, text, caller).await);
        }
    }
}

fn refuse(request: Request) {
    match request {
        Request::Notice { reply, .. } => drop(reply.send(Err(SubmitError::ShuttingDown))),
        Request::Withdraw { reply, .. } => drop(reply.send(Err(SubmitError::ShuttingDown))),
        Request::ClockFire { reply, .. } => drop(reply.send(Err(SubmitError::ShuttingDown))),
    }
}
