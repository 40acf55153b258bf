//! Who may use the console: whoever presents the token from `[http] token_env`, as
//! `Authorization: Bearer <token>` or once on the login form. A login gets a random session
//! id in an `HttpOnly; SameSite=Strict` cookie (the token itself never leaves the form
//! body, so it is in no URL and no log) and a CSRF token that every form of that session
//! carries back. Comparisons of secrets are constant-time (`subtle`). Sessions live in
//! memory, bounded, and end with the daemon.

use std::collections::HashMap;
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
        }
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
        if let Some(bearer) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        {
            return self.token_matches(bearer.trim()).then_some(Access::Bearer);
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
