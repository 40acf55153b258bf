//! What `parlor chat` and `parlor ask` say when no model can be reached: one paragraph on
//! what is missing and how to fix it, instead of retries and a stack of log lines. A
//! first-time user has no key and the default endpoint; a local server on the usual Ollama
//! port is offered when it answers.

use std::time::Duration;

use crate::config::Config;

/// Where a local Ollama (or a llama.cpp server started on that port) answers.
const LOCAL_PROBE: &str = "http://127.0.0.1:11434";
/// For tests only: a fake local server cannot own port 11434, so they point the probe here.
pub const PROBE_ENV: &str = "PARLOR_LOCAL_LLM_PROBE";
const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
// A loopback server answers at once or not at all; a first run must not hang on it.
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);
/// How long resolving and connecting to the configured endpoint may take before it counts
/// as unreachable.
const ENDPOINT_TIMEOUT: Duration = Duration::from_secs(3);

/// The explanation when the config cannot work as it stands (no key for OpenAI's endpoint,
/// or an endpoint that does not resolve or accept a connection), or `None` when a model may
/// be reachable. Checked once, before the conversation starts, so that a typo in
/// `base_url` or a missing network is one paragraph, not retries and WARN lines.
pub async fn preflight(config: &Config) -> Option<String> {
    if config.api_key().is_some() || config.base_url() != DEFAULT_BASE_URL {
        let reason = endpoint_unreachable(&config.base_url()).await?;
        return Some(unreachable(config, &reason).await);
    }
    let mut text = String::from(
        "parlor has no model to talk to: no API key is set and the endpoint is OpenAI's \
         default (https://api.openai.com/v1).",
    );
    text.push_str(&advice());
    text.push_str(&local_offer().await);
    Some(text)
}

/// The explanation after a turn failed to reach the model at all.
pub async fn unreachable(config: &Config, error: &str) -> String {
    let mut text = format!(
        "parlor could not reach the model at {} ({error}).",
        config.base_url()
    );
    text.push_str(&advice());
    text.push_str(&local_offer().await);
    text
}

/// Whether a turn failed because the model's server could not be reached at all (DNS,
/// refused, timed out), as opposed to answering with an error the user should read as is.
pub fn is_unreachable(error: &parlor_bot::agent::AgentError) -> bool {
    use parlor_bot::llm::LlmError;
    let parlor_bot::agent::AgentError::Llm(e) = error;
    matches!(e, LlmError::Connect(_) | LlmError::Timeout(_))
}

fn advice() -> String {
    " For OpenAI, set OPENAI_API_KEY (or [llm] api_key_env / api_key_file in the config, or \
     the systemd credential llm_api_key). For another OpenAI-compatible provider, also set \
     [llm] base_url (or OPENAI_BASE_URL) up to and including /v1, and [llm] model (or \
     PARLOR_MODEL). For a local Ollama or llama.cpp server, set base_url to its /v1 address \
     (Ollama: http://127.0.0.1:11434/v1); it needs no key. See config.example.toml."
        .to_owned()
}

/// Why the endpoint cannot be reached (its host does not resolve, nothing accepts a
/// connection), or `None` when it can, or when a proxy is set (the connection would go
/// through it, so a direct one proves nothing).
async fn endpoint_unreachable(base: &str) -> Option<String> {
    if parlor_bot::net::proxy_set() {
        return None;
    }
    // A malformed URL is `check-config`'s to report.
    let url = reqwest::Url::parse(base).ok()?;
    let host = url
        .host_str()?
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = url.port_or_known_default()?;
    let secs = ENDPOINT_TIMEOUT.as_secs();
    let addrs: Vec<_> =
        match tokio::time::timeout(ENDPOINT_TIMEOUT, tokio::net::lookup_host((host, port))).await {
            Err(_) => return Some(format!("looking up {host} took more than {secs} s")),
            Ok(Err(e)) => return Some(format!("cannot resolve {host}: {e}")),
            Ok(Ok(addrs)) => addrs.collect(),
        };
    let mut why = format!("{host} has no address");
    for addr in addrs {
        match tokio::time::timeout(ENDPOINT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => return None,
            Ok(Err(e)) => why = format!("{addr}: {e}"),
            Err(_) => why = format!("{addr}: no answer within {secs} s"),
        }
    }
    Some(why)
}

/// The config lines to use a local server, when one answers on loopback; empty otherwise.
async fn local_offer() -> String {
    let base = std::env::var(PROBE_ENV).unwrap_or_else(|_| LOCAL_PROBE.to_owned());
    let base = base.trim_end_matches('/');
    if !is_loopback(base) || !answers(base).await {
        return String::new();
    }
    format!(
        "\n\nA local model server answers at {base}. To use it, put in the config:\n\n\
         [llm]\nbase_url = \"{base}/v1\"\nmodel = \"<a model it serves, e.g. llama3.2>\"\n\n\
         or run with OPENAI_BASE_URL={base}/v1 PARLOR_MODEL=<model>."
    )
}

/// The probe never leaves the machine, whatever the variable says.
fn is_loopback(base: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

async fn answers(base: &str) -> bool {
    let Ok(client) = reqwest::Client::builder()
        .timeout(PROBE_TIMEOUT)
        .no_proxy()
        .build()
    else {
        return false;
    };
    // Ollama answers /api/tags; llama.cpp's server and most others answer /v1/models.
    for path in ["/api/tags", "/v1/models"] {
        if let Ok(resp) = client.get(format!("{base}{path}")).send().await
            && resp.status().is_success()
        {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::is_loopback;

    #[test]
    fn the_probe_stays_on_loopback() {
        assert!(is_loopback("http://127.0.0.1:11434"));
        assert!(is_loopback("http://localhost:1"));
        assert!(is_loopback("http://[::1]:5"));
        assert!(!is_loopback("http://example.com:11434"));
        assert!(!is_loopback("http://10.0.0.1:11434"));
        assert!(!is_loopback("not a url"));
    }
}
