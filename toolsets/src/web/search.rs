//! The search providers behind `web_search`: SearXNG's JSON API, the Brave Search API and
//! DuckDuckGo's keyless HTML endpoint (parsed with an HTML parser, `dom_query`). Their
//! endpoints are the operator's configuration, not the model's, so they are reached with a
//! plain client (a self-hosted SearXNG usually sits on a private address), never through the
//! URL guard; the client still ignores `HTTP(S)_PROXY`, like every web tool.

use std::fmt;
use std::time::Duration;

use dom_query::Document;
use reqwest::{StatusCode, Url, header};
use serde::Deserialize;

/// Which search service answers `web_search`.
#[derive(Clone, PartialEq, Eq)]
pub enum Provider {
    /// A SearXNG instance's JSON API (`format=json` must be enabled in its settings).
    Searxng {
        /// The instance's base URL (`http://127.0.0.1:8888`).
        base_url: String,
    },
    /// The Brave Search API.
    Brave {
        /// The API's base URL (`https://api.search.brave.com`).
        base_url: String,
        /// The subscription token.
        api_key: String,
    },
    /// DuckDuckGo's HTML results page; needs no key.
    DuckDuckGo {
        /// The endpoint's base URL (`https://html.duckduckgo.com`).
        base_url: String,
    },
}

impl fmt::Debug for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provider::Searxng { base_url } => write!(f, "Searxng({base_url})"),
            // The key never reaches a log.
            Provider::Brave { base_url, .. } => write!(f, "Brave({base_url})"),
            Provider::DuckDuckGo { base_url } => write!(f, "DuckDuckGo({base_url})"),
        }
    }
}

impl Default for Provider {
    fn default() -> Self {
        Provider::DuckDuckGo {
            base_url: DUCKDUCKGO_URL.to_owned(),
        }
    }
}

/// DuckDuckGo's HTML endpoint.
pub const DUCKDUCKGO_URL: &str = "https://html.duckduckgo.com";
/// The Brave Search API.
pub const BRAVE_URL: &str = "https://api.search.brave.com";

impl Provider {
    /// The provider's name as configured (`searxng`, `brave`, `duckduckgo`).
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Searxng { .. } => "searxng",
            Provider::Brave { .. } => "brave",
            Provider::DuckDuckGo { .. } => "duckduckgo",
        }
    }
}

/// How recent results must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Freshness {
    /// The last 24 hours.
    Day,
    /// The last 7 days.
    Week,
    /// The last 31 days.
    Month,
    /// The last 365 days.
    Year,
}

/// One result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The page's title.
    pub title: String,
    /// The page's URL.
    pub url: String,
    /// The provider's excerpt.
    pub snippet: String,
    /// When the page was published, as the provider says it.
    pub published: Option<String>,
}

/// Why a search gave no answer. Never an empty list: "nothing found" is `Ok(vec![])`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    /// The provider refuses more queries for now (HTTP 429, DuckDuckGo's 202 challenge).
    #[error("{message}")]
    RateLimited {
        /// What to tell the model.
        message: String,
        /// The provider's `Retry-After`, when it sent one.
        retry_after: Option<u64>,
    },
    /// The provider could not be reached, failed, or answered something unreadable.
    #[error("{0}")]
    Unavailable(String),
}

/// One search as the tool asks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query<'a> {
    /// The words, with `site:` already added.
    pub text: &'a str,
    /// At most this many results.
    pub count: usize,
    /// How recent.
    pub freshness: Option<Freshness>,
}

/// The search client: one provider, a plain HTTP client with a timeout.
#[derive(Debug, Clone)]
pub struct Searcher {
    provider: Provider,
    client: reqwest::Client,
}

impl Searcher {
    /// A searcher asking `provider`, each query bounded by `timeout`.
    pub fn new(provider: Provider, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .no_proxy()
            .user_agent(concat!(
                "parlor/",
                env!("CARGO_PKG_VERSION"),
                " (web_search)"
            ))
            .build()?;
        Ok(Searcher { provider, client })
    }

    /// The provider asked.
    pub fn provider(&self) -> &Provider {
        &self.provider
    }

    /// Runs `query`.
    pub async fn search(&self, query: &Query<'_>) -> Result<Vec<Hit>, SearchError> {
        let mut hits = match &self.provider {
            Provider::Searxng { base_url } => self.searxng(base_url, query).await?,
            Provider::Brave { base_url, api_key } => self.brave(base_url, api_key, query).await?,
            Provider::DuckDuckGo { base_url } => self.duckduckgo(base_url, query).await?,
        };
        hits.truncate(query.count);
        Ok(hits)
    }

    async fn searxng(&self, base: &str, query: &Query<'_>) -> Result<Vec<Hit>, SearchError> {
        let mut url = endpoint(base, "search")?;
        url.query_pairs_mut()
            .append_pair("q", query.text)
            .append_pair("format", "json");
        if let Some(f) = query.freshness {
            let range = match f {
                Freshness::Day => "day",
                Freshness::Week => "week",
                Freshness::Month => "month",
                Freshness::Year => "year",
            };
            url.query_pairs_mut().append_pair("time_range", range);
        }
        let body = self.get(url, None, "SearXNG").await?;
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            results: Vec<Result>,
        }
        #[derive(Deserialize)]
        struct Result {
            #[serde(default)]
            title: String,
            url: String,
            #[serde(default)]
            content: Option<String>,
            #[serde(default, rename = "publishedDate")]
            published: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body)
            .map_err(|e| unreadable("SearXNG", &format!("its JSON does not fit ({e})")))?;
        Ok(answer
            .results
            .into_iter()
            .map(|r| Hit {
                title: tidy(&r.title),
                url: r.url,
                snippet: tidy(r.content.as_deref().unwrap_or_default()),
                published: r.published.filter(|p| !p.trim().is_empty()),
            })
            .collect())
    }

    async fn brave(
        &self,
        base: &str,
        key: &str,
        query: &Query<'_>,
    ) -> Result<Vec<Hit>, SearchError> {
        let mut url = endpoint(base, "res/v1/web/search")?;
        url.query_pairs_mut()
            .append_pair("q", query.text)
            .append_pair("count", &query.count.clamp(1, 20).to_string());
        if let Some(f) = query.freshness {
            let code = match f {
                Freshness::Day => "pd",
                Freshness::Week => "pw",
                Freshness::Month => "pm",
                Freshness::Year => "py",
            };
            url.query_pairs_mut().append_pair("freshness", code);
        }
        let body = self.get(url, Some(key), "Brave Search").await?;
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            web: Option<Web>,
        }
        #[derive(Deserialize)]
        struct Web {
            #[serde(default)]
            results: Vec<Result>,
        }
        #[derive(Deserialize)]
        struct Result {
            #[serde(default)]
            title: String,
            url: String,
            #[serde(default)]
            description: Option<String>,
            #[serde(default)]
            age: Option<String>,
            #[serde(default)]
            page_age: Option<String>,
        }
        let answer: Answer = serde_json::from_slice(&body)
            .map_err(|e| unreadable("Brave Search", &format!("its JSON does not fit ({e})")))?;
        Ok(answer
            .web
            .map(|w| w.results)
            .unwrap_or_default()
            .into_iter()
            .map(|r| Hit {
                title: tidy(&r.title),
                url: r.url,
                // Brave marks the query words with <strong>.
                snippet: tidy(&html_text(r.description.as_deref().unwrap_or_default())),
                published: r.page_age.or(r.age).filter(|p| !p.trim().is_empty()),
            })
            .collect())
    }

    async fn duckduckgo(&self, base: &str, query: &Query<'_>) -> Result<Vec<Hit>, SearchError> {
        let mut url = endpoint(base, "html/")?;
        url.query_pairs_mut().append_pair("q", query.text);
        if let Some(f) = query.freshness {
            let code = match f {
                Freshness::Day => "d",
                Freshness::Week => "w",
                Freshness::Month => "m",
                Freshness::Year => "y",
            };
            url.query_pairs_mut().append_pair("df", code);
        }
        let response = self.send(url, None, "DuckDuckGo").await?;
        // DuckDuckGo answers a client it takes for a bot with 202 and a challenge page.
        if response.status() == StatusCode::ACCEPTED {
            return Err(SearchError::RateLimited {
                message: "DuckDuckGo is refusing automated searches for now (it answered with \
                          a challenge); try again later"
                    .to_owned(),
                retry_after: None,
            });
        }
        let body = read(response, "DuckDuckGo").await?;
        let html = String::from_utf8_lossy(&body);
        parse_duckduckgo(&html)
    }

    async fn get(
        &self,
        url: Url,
        brave_key: Option<&str>,
        who: &str,
    ) -> Result<Vec<u8>, SearchError> {
        let response = self.send(url, brave_key, who).await?;
        read(response, who).await
    }

    async fn send(
        &self,
        url: Url,
        brave_key: Option<&str>,
        who: &str,
    ) -> Result<reqwest::Response, SearchError> {
        let mut request = self.client.get(url);
        request = match brave_key {
            Some(key) => request
                .header("X-Subscription-Token", key)
                .header(header::ACCEPT, "application/json"),
            None => request.header(header::ACCEPT, "application/json, text/html;q=0.9"),
        };
        let response = request.send().await.map_err(|e| {
            let what = if e.is_timeout() {
                "did not answer in time".to_owned()
            } else {
                format!("could not be reached ({})", innermost(&e))
            };
            SearchError::Unavailable(format!("the search provider {who} {what}"))
        })?;
        let status = response.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            return Err(SearchError::RateLimited {
                message: format!(
                    "the search provider {who} is rate limiting the bot (HTTP 429); try again \
                     {}",
                    retry_after.map_or("later".to_owned(), |s| format!("in {s} s"))
                ),
                retry_after,
            });
        }
        if !status.is_success() {
            return Err(SearchError::Unavailable(format!(
                "the search provider {who} failed (HTTP {status}); this says nothing about \
                 whether results exist"
            )));
        }
        Ok(response)
    }
}

/// Most bytes of a provider's answer read; result pages are far smaller.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

async fn read(mut response: reqwest::Response, who: &str) -> Result<Vec<u8>, SearchError> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                    return Err(unreadable(who, "its answer is far too large"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(SearchError::Unavailable(format!(
                    "the search provider {who} broke off its answer ({})",
                    innermost(&e)
                )));
            }
        }
    }
}

fn unreadable(who: &str, why: &str) -> SearchError {
    SearchError::Unavailable(format!(
        "the search provider {who} answered something unreadable: {why}"
    ))
}

fn innermost(error: &reqwest::Error) -> String {
    let mut cause = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        cause = e.to_string();
        source = e.source();
    }
    cause
}

/// `base` joined with `path`, whether or not `base` ends in a slash.
fn endpoint(base: &str, path: &str) -> Result<Url, SearchError> {
    let base = format!("{}/", base.trim_end_matches('/'));
    Url::parse(&base).and_then(|b| b.join(path)).map_err(|e| {
        SearchError::Unavailable(format!(
            "the search provider's configured URL {base:?} is not valid ({e})"
        ))
    })
}

/// Whitespace runs as one space.
fn tidy(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text of an HTML fragment.
fn html_text(fragment: &str) -> String {
    if !fragment.contains('<') && !fragment.contains('&') {
        return fragment.to_owned();
    }
    Document::fragment(fragment).root().text().to_string()
}

/// The organic results of DuckDuckGo's HTML page (`div.result` holding `a.result__a` and
/// `.result__snippet`; ads, `result--ad`, skipped). Result links point at DuckDuckGo's
/// redirector (`//duckduckgo.com/l/?uddg=<target>`); the target is taken out of it.
pub fn parse_duckduckgo(html: &str) -> Result<Vec<Hit>, SearchError> {
    let doc = Document::from(html);
    let mut hits = Vec::new();
    if let Some(results) = doc.try_select("div.result") {
        for result in results.iter() {
            if result.has_class("result--ad") {
                continue;
            }
            let link = result.select("a.result__a");
            let Some(href) = link.attr("href") else {
                continue;
            };
            let Some(url) = duckduckgo_target(&href) else {
                continue;
            };
            let snippet = result.select(".result__snippet");
            hits.push(Hit {
                title: tidy(&link.text()),
                url,
                snippet: tidy(&snippet.text()),
                published: None,
            });
        }
    }
    let empty_page = doc.try_select(".no-results").is_some();
    if hits.is_empty() && !empty_page && doc.try_select("#links, .results").is_none() {
        return Err(unreadable(
            "DuckDuckGo",
            "the page has no result list (a challenge page, or DuckDuckGo changed its layout)",
        ));
    }
    Ok(hits)
}

/// The real target of a DuckDuckGo result link.
fn duckduckgo_target(href: &str) -> Option<String> {
    let absolute = if href.starts_with("//") {
        format!("https:{href}")
    } else if href.starts_with('/') {
        format!("https://duckduckgo.com{href}")
    } else {
        href.to_owned()
    };
    let url = Url::parse(&absolute).ok()?;
    let target = if url.path() == "/l/" || url.path() == "/l" {
        url.query_pairs()
            .find(|(k, _)| k == "uddg")
            .map(|(_, v)| v.into_owned())?
    } else {
        absolute
    };
    matches!(Url::parse(&target).ok()?.scheme(), "http" | "https").then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duckduckgo_links_are_unwrapped() {
        assert_eq!(
            duckduckgo_target(
                "//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2Fa%3Fb%3D1&rut=x"
            )
            .as_deref(),
            Some("https://example.com/a?b=1")
        );
        assert_eq!(
            duckduckgo_target("https://example.org/x").as_deref(),
            Some("https://example.org/x")
        );
        assert_eq!(
            duckduckgo_target("//duckduckgo.com/l/?uddg=javascript%3Aalert(1)"),
            None
        );
        assert_eq!(
            endpoint("http://h:1/", "search").unwrap().as_str(),
            "http://h:1/search"
        );
        assert_eq!(
            endpoint("http://h:1/sx", "search").unwrap().as_str(),
            "http://h:1/sx/search"
        );
    }
}
