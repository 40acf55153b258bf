//! The connections of a [`PgStore`](super::PgStore): a few OS threads, each owning one
//! synchronous `postgres::Client`, serving calls sent to them over a channel.
//!
//! Why threads: `postgres::Client` drives its connection on a runtime of its own and panics
//! when it is used from inside a tokio runtime thread, while the daemon calls the `Store`
//! from tokio tasks. So a call is a boxed closure sent to a connection thread; the caller
//! blocks on the reply (inside `block_in_place` on a multi-thread runtime, so the runtime
//! moves its other tasks off the thread while it waits).
//!
//! A connection that failed is dropped; the next call on that thread connects again. A
//! write is not retried once its transaction began: if the connection broke after that, it
//! may or may not have committed, and the caller (intake, a commit) already handles a
//! failed write. A connection found broken at `BEGIN` (ended while idle), or under a read,
//! is made again and the call goes on, since nothing of it had changed anything.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::types::ToSql;
use postgres::{Client, Config, GenericClient, NoTls, Row, Statement};

use crate::store::StoreError;

/// How many connections (and threads) a store keeps: intake, a few chats' commits and the
/// outbox lanes at once, without taking many of the server's connection slots.
pub(super) const CONNECTIONS: usize = 4;

/// How long a connection attempt may take.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one statement may run on the server (`statement_timeout`), lock waits included.
pub(super) const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a caller waits for its reply: a whole transaction of several statements, plus
/// a connection attempt. Past it the call fails even if the server never answers (a dead
/// peer, before TCP notices).
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// How often a transaction refused for a transient conflict (a deadlock between two
/// writers, a serialization failure) is run again before its error is returned.
const CONFLICT_ATTEMPTS: usize = 5;

/// What a transaction body fails with: the store's own refusal (returned as it is, after a
/// rollback) or a database error (mapped, and retried when transient).
#[derive(Debug)]
pub(super) enum TxError {
    /// The store refuses (a changed record, a corrupt value).
    Store(StoreError),
    /// The database failed.
    Pg(postgres::Error),
}

impl From<postgres::Error> for TxError {
    fn from(e: postgres::Error) -> Self {
        TxError::Pg(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

/// A transaction body's result.
pub(super) type TxResult<T> = Result<T, TxError>;

/// A client or transaction with the connection's prepared statements: each SQL text is
/// parsed once per connection instead of once per call.
pub(super) struct Db<'a, C: GenericClient> {
    client: &'a mut C,
    statements: &'a mut HashMap<&'static str, Statement>,
}

impl<C: GenericClient> Db<'_, C> {
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql)?;
        self.statements.insert(sql, statement.clone());
        Ok(statement)
    }

    /// Every row of `sql`.
    pub(super) fn query(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.query(&statement, params)
    }

    /// The one row of `sql`, if any.
    pub(super) fn query_opt(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.query_opt(&statement, params)
    }

    /// The one row `sql` must return.
    pub(super) fn query_one(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.query_one(&statement, params)
    }

    /// Runs statements that take no parameters (a migration's file).
    pub(super) fn batch(&mut self, sql: &str) -> Result<(), postgres::Error> {
        self.client.batch_execute(sql)
    }

    /// How many rows `sql` changed.
    pub(super) fn execute(
        &mut self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let statement = self.statement(sql)?;
        self.client.execute(&statement, params)
    }
}

/// One connection thread's state.
struct Conn {
    config: Config,
    client: Option<Client>,
    statements: HashMap<&'static str, Statement>,
    /// Names the server in errors, without the password.
    server: Arc<str>,
}

impl Conn {
    fn client(&mut self) -> Result<&mut Client, StoreError> {
        if self.client.as_ref().is_some_and(Client::is_closed) {
            self.client = None;
        }
        if self.client.is_none() {
            self.statements.clear();
            let client = self.config.connect(NoTls).map_err(|e| {
                StoreError::Io(format!(
                    "cannot connect to PostgreSQL at {}: {}",
                    self.server,
                    describe(&e)
                ))
            })?;
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| StoreError::Io("no PostgreSQL connection".to_owned()))
    }

    /// Drops the connection after an error that may have broken it; the next call connects
    /// again. A server's refusal of one statement (a constraint, a conflict) leaves it up.
    /// `true` when it dropped the connection.
    fn after_error(&mut self, e: &postgres::Error) -> bool {
        // FATAL: the server ends the session (terminated by an operator, shutting down).
        let fatal = e
            .as_db_error()
            .is_none_or(|db| matches!(db.severity(), "FATAL" | "PANIC"));
        if fatal || e.is_closed() {
            self.client = None;
            self.statements.clear();
            return true;
        }
        false
    }

    /// Runs `body` in one READ COMMITTED transaction (the server's default), committed when
    /// it returns `Ok`; a transient conflict runs it again. A connection found broken at
    /// `BEGIN` (the server restarted, or ended an idle session) is made again and the
    /// transaction started on it: nothing of it had reached the server.
    fn write<T>(
        &mut self,
        body: &mut dyn FnMut(&mut Db<'_, postgres::Transaction<'_>>) -> TxResult<T>,
    ) -> Result<T, StoreError> {
        let server = Arc::clone(&self.server);
        let (mut attempt, mut reconnected) = (0, false);
        loop {
            attempt += 1;
            match self.try_write(body) {
                Ok(value) => return Ok(value),
                Err(Failure::Begin(e)) => {
                    if self.after_error(&e) && !reconnected {
                        reconnected = true;
                        tracing::debug!(error = %describe(&e), "PostgreSQL connection lost while idle; again");
                        continue;
                    }
                    return Err(pg_error(&server, &e));
                }
                Err(Failure::Tx(TxError::Store(e))) => return Err(e),
                Err(Failure::Tx(TxError::Pg(e))) => {
                    self.after_error(&e);
                    if is_transient(&e) && attempt < CONFLICT_ATTEMPTS {
                        tracing::debug!(error = %describe(&e), attempt, "PostgreSQL conflict; again");
                        continue;
                    }
                    return Err(pg_error(&server, &e));
                }
            }
        }
    }

    fn try_write<T>(
        &mut self,
        body: &mut dyn FnMut(&mut Db<'_, postgres::Transaction<'_>>) -> TxResult<T>,
    ) -> Result<T, Failure> {
        self.client().map_err(|e| Failure::Tx(TxError::Store(e)))?;
        let Conn {
            client, statements, ..
        } = self;
        let client = client.as_mut().ok_or_else(|| {
            Failure::Tx(TxError::Store(StoreError::Io(
                "no PostgreSQL connection".to_owned(),
            )))
        })?;
        let mut tx = client.transaction().map_err(Failure::Begin)?;
        let value = body(&mut Db {
            client: &mut tx,
            statements,
        })
        .map_err(Failure::Tx)?;
        tx.commit().map_err(|e| Failure::Tx(TxError::Pg(e)))?;
        Ok(value)
    }

    /// Runs `body` outside a transaction: one read statement sees one snapshot. A read that
    /// failed on a broken connection runs once more on a new one (it changed nothing).
    fn read<T>(
        &mut self,
        body: &mut dyn FnMut(&mut Db<'_, Client>) -> TxResult<T>,
    ) -> Result<T, StoreError> {
        let server = Arc::clone(&self.server);
        let mut reconnected = false;
        loop {
            self.client()?;
            let Conn {
                client, statements, ..
            } = self;
            let Some(client) = client.as_mut() else {
                return Err(StoreError::Io("no PostgreSQL connection".to_owned()));
            };
            match body(&mut Db { client, statements }) {
                Ok(value) => return Ok(value),
                Err(TxError::Store(e)) => return Err(e),
                Err(TxError::Pg(e)) => {
                    if self.after_error(&e) && !reconnected {
                        reconnected = true;
                        continue;
                    }
                    return Err(pg_error(&server, &e));
                }
            }
        }
    }
}

/// How a transaction failed: before any of it reached the server (at `BEGIN`), or in it.
enum Failure {
    Begin(postgres::Error),
    Tx(TxError),
}

/// A call, run on a connection thread.
type Job = Box<dyn FnOnce(&mut Conn) + Send>;

/// The connection threads and the channel to them.
pub(super) struct Pool {
    /// `None` once the pool is shut down (on drop), which ends the threads.
    jobs: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// `host:port/dbname`, for errors.
    server: Arc<str>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Starts `size` connection threads for `config`; they connect on their first call.
    pub(super) fn start(config: Config, size: usize) -> Result<Pool, StoreError> {
        let server: Arc<str> = describe_server(&config).into();
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(size);
        for n in 0..size.max(1) {
            let rx = Arc::clone(&rx);
            let conn = Conn {
                config: config.clone(),
                client: None,
                statements: HashMap::new(),
                server: Arc::clone(&server),
            };
            let thread = std::thread::Builder::new()
                .name(format!("parlor-pg-{n}"))
                .spawn(move || serve(conn, &rx))
                .map_err(|e| StoreError::Io(format!("cannot start a PostgreSQL thread: {e}")))?;
            threads.push(thread);
        }
        Ok(Pool {
            jobs: Mutex::new(Some(tx)),
            threads: Mutex::new(threads),
            server,
        })
    }

    /// Where the pool connects, without credentials.
    pub(super) fn server(&self) -> &str {
        &self.server
    }

    /// Runs `body` in one transaction on a connection thread and waits for its result.
    pub(super) fn write<T, F>(&self, mut body: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut Db<'_, postgres::Transaction<'_>>) -> TxResult<T> + Send + 'static,
    {
        self.call(move |conn| conn.write(&mut body))
    }

    /// Runs `body` on a connection thread, outside a transaction (reads of one statement).
    pub(super) fn read<T, F>(&self, mut body: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(&mut Db<'_, Client>) -> TxResult<T> + Send + 'static,
    {
        self.call(move |conn| conn.read(&mut body))
    }

    fn call<T: Send + 'static>(
        &self,
        run: impl FnOnce(&mut Conn) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = mpsc::sync_channel::<Result<T, StoreError>>(1);
        let job: Job = Box::new(move |conn| {
            // The caller may have given up (its timeout); then nobody reads this.
            let _ = reply.send(run(conn));
        });
        {
            let jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(jobs) = jobs.as_ref() else {
                return Err(StoreError::Io("the PostgreSQL store is closed".to_owned()));
            };
            jobs.send(job).map_err(|_| {
                StoreError::Io("the PostgreSQL store's connection threads ended".to_owned())
            })?;
        }
        match wait_blocking(|| answer.recv_timeout(CALL_TIMEOUT)) {
            Ok(result) => result,
            Err(RecvTimeoutError::Timeout) => Err(StoreError::Io(format!(
                "PostgreSQL at {} did not answer within {} s",
                self.server,
                CALL_TIMEOUT.as_secs()
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(StoreError::Io(format!(
                "a call to PostgreSQL at {} failed unexpectedly (a value of an unexpected \
                 type?)",
                self.server
            ))),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the channel ends each thread after its current call.
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for thread in threads {
            // A thread stuck on a dead server is left to end by itself (its socket times
            // out) rather than holding up the drop.
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

/// A connection thread: takes calls until the pool closes its channel.
fn serve(mut conn: Conn, jobs: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let jobs = jobs.lock().unwrap_or_else(PoisonError::into_inner);
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        // A value of an unexpected type (a schema changed by hand) panics in `Row::get`;
        // the caller then gets an error (its reply sender is dropped), and the thread
        // goes on with a fresh connection rather than the pool losing it.
        let run = std::panic::AssertUnwindSafe(|| job(&mut conn));
        if std::panic::catch_unwind(run).is_err() {
            conn.client = None;
            conn.statements.clear();
        }
    }
}

/// Blocks the calling thread on `wait`. On a multi-thread tokio runtime's worker this is
/// announced with `block_in_place`, so the runtime hands the thread's other tasks to
/// another worker meanwhile. A current-thread runtime cannot do that (`block_in_place`
/// panics there); it simply blocks, as a sled call would.
fn wait_blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

/// Whether the server refused the transaction for a conflict that a retry may not meet:
/// a deadlock between two writers or a serialization failure.
fn is_transient(e: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    e.code().is_some_and(|code| {
        *code == SqlState::T_R_DEADLOCK_DETECTED || *code == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// A database error as the store reports it.
pub(super) fn pg_error(server: &str, e: &postgres::Error) -> StoreError {
    StoreError::Io(format!("PostgreSQL at {server}: {}", describe(e)))
}

/// The server's message (and its detail) when it sent one; else the client's.
pub(super) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({}): {detail}", db.message(), db.code().code()),
            None => format!("{} ({})", db.message(), db.code().code()),
        },
        None => match std::error::Error::source(e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        },
    }
}

/// `host:port/dbname` of a config, for messages: never its user's password.
pub(super) fn describe_server(config: &Config) -> String {
    use postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = config
                .get_ports()
                .get(i)
                .or(config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}/{}",
        if hosts.is_empty() {
            "localhost".to_owned()
        } else {
            hosts.join(",")
        },
        config.get_dbname().unwrap_or("(default database)")
    )
}
