//! Who may use the console: whoever presents the token from `[http] token_env`, as
//! `Authorization: Bearer <token>` or once on the login form. A login gets a random session
//! id in an `HttpOnly; SameSite=Strict` cookie (the token itself never leaves the form
//! body, so it is in no URL and no log) and a CSRF token that every form of that session
//! carries back. Comparisons of secrets are constant-time (`subtle`). Sessions live in
//! memory, bounded, and end with the daemon.
//!
//! Wrong tokens are throttled per client address ([`Throttle`]): a few are free, then each
//! one makes the client wait (429 with `Retry-After`), the wait doubling up to a cap.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header;
use subtle::ConstantTimeEq;

use crate::secrets::Secret;

/// The session cookie's name.
pub const COOKIE: &str = "parlor_console";
/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Logins kept at once; the oldest goes first.
const MAX_SESSIONS: usize = 32;

/// How a request proved itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// `Authorization: Bearer`: no browser sends it on its own, so no CSRF check.
    Bearer,
    /// A login session; its forms must carry this CSRF token.
    Session {
        /// The session's CSRF token.
        csrf: String,
    },
}

struct Login {
    csrf: String,
    created: Instant,
}

/// The token and the logins.
pub struct Auth {
    token: Secret,
    logins: Mutex<HashMap<String, Login>>,
    /// Wrong tokens by client, so guessing the token costs time.
    throttle: Throttle,
}

/// Wrong tokens a client may present before it must wait.
const FREE_FAILURES: u32 = 5;
/// The wait after the first wrong token past the free ones; it doubles with each further.
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// Clients the throttle remembers; past it, the one seen least recently is forgotten.
pub const MAX_CLIENTS: usize = 1024;

/// The address a request came from, put into its extensions by the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client(pub IpAddr);

struct Strikes {
    failures: u32,
    until: Option<Instant>,
    seen: Instant,
}

/// Wrong tokens per client address: after [`FREE_FAILURES`], each makes the client wait
/// from 1 s doubling to 5 min; a right token clears its record. Bounded at
/// [`MAX_CLIENTS`]. IPv6 clients count by their /64, which one host usually holds whole.
#[derive(Default)]
pub struct Throttle {
    clients: Mutex<HashMap<IpAddr, Strikes>>,
}

impl Throttle {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Strikes>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `client` must still wait before it may present a token; `None`: now.
    pub fn wait(&self, client: IpAddr) -> Option<Duration> {
        let until = self.clients().get(&key(client))?.until?;
        until.checked_duration_since(Instant::now())
    }

    /// Records a wrong token from `client`.
    pub fn failed(&self, client: IpAddr) {
        let now = Instant::now();
        let mut clients = self.clients();
        let key = key(client);
        if !clients.contains_key(&key)
            && clients.len() >= MAX_CLIENTS
            && let Some(oldest) = clients.iter().min_by_key(|(_, s)| s.seen).map(|(k, _)| *k)
        {
            clients.remove(&oldest);
        }
        let strikes = clients.entry(key).or_insert(Strikes {
            failures: 0,
            until: None,
            seen: now,
        });
        strikes.failures = strikes.failures.saturating_add(1);
        strikes.seen = now;
        if let Some(past) = strikes.failures.checked_sub(FREE_FAILURES + 1) {
            let wait = FIRST_WAIT
                .checked_mul(1u32 << past.min(16))
                .map_or(MAX_WAIT, |w| w.min(MAX_WAIT));
            strikes.until = Some(now + wait);
        }
    }

    /// Records a right token from `client`: its record goes.
    pub fn succeeded(&self, client: IpAddr) {
        self.clients().remove(&key(client));
    }
}

/// The throttle's key for `ip`: itself, a v4-mapped address as v4, other IPv6 by /64.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & 0xffff_ffff_ffff_ffff_0000_0000_0000_0000,
            )),
        },
    }
}

/// 32 random bytes, hex.
fn random_id() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

impl Auth {
    /// Checks against `token`.
    pub fn new(token: Secret) -> Self {
        Auth {
            token,
            logins: Mutex::new(HashMap::new()),
            throttle: Throttle::default(),
        }
    }

    /// Wrong tokens by client.
    pub fn throttle(&self) -> &Throttle {
        &self.throttle
    }

    /// The bearer token these headers present, if any (right or wrong).
    pub fn bearer(headers: &HeaderMap) -> Option<&str> {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
    }

    fn logins(&self) -> std::sync::MutexGuard<'_, HashMap<String, Login>> {
        self.logins.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `given` is the token.
    pub fn token_matches(&self, given: &str) -> bool {
        equal(given, self.token.expose())
    }

    /// A new login: its session id (for the cookie). `None` when the system has no
    /// randomness to give.
    pub fn login(&self) -> Option<String> {
        let id = random_id()?;
        let csrf = random_id()?;
        let mut logins = self.logins();
        logins.retain(|_, l| l.created.elapsed() < SESSION_TTL);
        if logins.len() >= MAX_SESSIONS
            && let Some(oldest) = logins
                .iter()
                .min_by_key(|(_, l)| l.created)
                .map(|(k, _)| k.clone())
        {
            logins.remove(&oldest);
        }
        logins.insert(
            id.clone(),
            Login {
                csrf,
                created: Instant::now(),
            },
        );
        Some(id)
    }

    /// Ends the login of these headers' cookie.
    pub fn logout(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.logins().remove(&id);
        }
    }

    /// How these headers prove themselves, if they do.
    pub fn check(&self, headers: &HeaderMap) -> Option<Access> {
        if let Some(bearer) = Auth::bearer(headers) {
            return self.token_matches(bearer).then_some(Access::Bearer);
        }
        let id = cookie(headers)?;
        let logins = self.logins();
        // The map is keyed by the id, so finding it compares it; the ids are random and
        // 256 bits long, which leaves timing nothing to learn.
        let login = logins.get(&id)?;
        (login.created.elapsed() < SESSION_TTL).then(|| Access::Session {
            csrf: login.csrf.clone(),
        })
    }
}

impl Access {
    /// Whether a form's `csrf` field fits this access.
    pub fn form_ok(&self, given: Option<&str>) -> bool {
        match self {
            Access::Bearer => true,
            Access::Session { csrf } => given.is_some_and(|g| equal(g, csrf)),
        }
    }

    /// The CSRF token forms carry (empty for bearer access, which needs none).
    pub fn csrf(&self) -> &str {
        match self {
            Access::Bearer => "",
            Access::Session { csrf } => csrf,
        }
    }
}

/// The session id in the request's cookies.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then(|| value.to_owned())
        })
}

/// The `Set-Cookie` value of a login.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that ends a login.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const TOKEN: &str = "a-console-token-of-length";

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_bearer_must_be_the_token() {
        let auth = Auth::new(Secret::new(TOKEN));
        let good = headers(&[(header::AUTHORIZATION, &format!("Bearer {TOKEN}"))]);
        assert_eq!(auth.check(&good), Some(Access::Bearer));
        let bad = headers(&[(header::AUTHORIZATION, "Bearer a-console-token-of-lengtX")]);
        assert_eq!(auth.check(&bad), None);
        assert_eq!(auth.check(&HeaderMap::new()), None);
    }

    #[test]
    fn a_login_is_its_cookie_and_its_forms_carry_its_csrf_token() {
        let auth = Auth::new(Secret::new(TOKEN));
        let id = auth.login().unwrap();
        assert_eq!(id.len(), 64);
        let cookie = format!("theme=dark; {COOKIE}={id}");
        let with = headers(&[(header::COOKIE, cookie.as_str())]);
        let access = auth.check(&with).unwrap();
        let csrf = access.csrf().to_owned();
        assert_eq!(csrf.len(), 64);
        assert!(access.form_ok(Some(&csrf)));
        assert!(!access.form_ok(Some("forged")));
        assert!(!access.form_ok(None));
        auth.logout(&with);
        assert_eq!(auth.check(&with), None);
        let made_up = headers(&[(header::COOKIE, &format!("{COOKIE}=00ff") as &str)]);
        assert_eq!(auth.check(&made_up), None);
        assert!(set_cookie(&id).contains("HttpOnly; SameSite=Strict"));
    }

    #[test]
    fn wrong_tokens_make_a_client_wait_longer_and_longer_and_a_right_one_clears_it() {
        let throttle = Throttle::default();
        let alice: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            throttle.failed(alice);
            assert_eq!(throttle.wait(alice), None);
        }
        throttle.failed(alice);
        let first = throttle.wait(alice).unwrap();
        assert!(first <= FIRST_WAIT && first > FIRST_WAIT / 2, "{first:?}");
        throttle.failed(alice);
        assert!(throttle.wait(alice).unwrap() > FIRST_WAIT, "doubled");
        for _ in 0..40 {
            throttle.failed(alice);
        }
        assert!(throttle.wait(alice).unwrap() <= MAX_WAIT, "capped");
        // Another address of the same IPv6 /64 is the same client; another v4 is not.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..=FREE_FAILURES {
            throttle.failed(v6);
        }
        assert!(throttle.wait("2001:db8::ffff".parse().unwrap()).is_some());
        assert_eq!(throttle.wait("192.0.2.2".parse().unwrap()), None);
        throttle.succeeded(alice);
        assert_eq!(throttle.wait(alice), None);
    }

    #[test]
    fn the_throttle_forgets_the_least_recent_client_past_its_bound() {
        let throttle = Throttle::default();
        for i in 0..(MAX_CLIENTS as u32 * 3) {
            throttle.failed(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert_eq!(throttle.clients().len(), MAX_CLIENTS);
    }

    #[test]
    fn logins_are_bounded() {
        let auth = Auth::new(Secret::new(TOKEN));
        let first = auth.login().unwrap();
        for _ in 0..MAX_SESSIONS {
            auth.login().unwrap();
        }
        assert_eq!(auth.logins().len(), MAX_SESSIONS);
        let old = headers(&[(header::COOKIE, &format!("{COOKIE}={first}") as &str)]);
        assert_eq!(auth.check(&old), None, "the oldest login went first");
    }
}
