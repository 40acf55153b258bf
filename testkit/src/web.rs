//! A fake of the web for the web tools: [`FakeWeb`] serves scripted pages on a loopback
//! address (`127.0.0.1`, or another of 127.0.0.0/8 as a second "host": Linux answers on all
//! of it), and records every request. Search providers are pages too, with bodies shaped
//! like the real services' answers:
//!
//! - [`searxng_json`]: SearXNG's `/search?format=json` answer (`query`, `results[]` with
//!   `url`, `title`, `content`, `engine`, `publishedDate`...).
//! - [`brave_json`]: the Brave Search API's `/res/v1/web/search` answer (`type: "search"`,
//!   `web.results[]` with `title`, `url`, `description` holding `<strong>` marks, `age`,
//!   `page_age`...).
//! - [`duckduckgo_html`]: DuckDuckGo's `html.duckduckgo.com/html/` page, with its markup:
//!   `div.result.results_links.web-result` per result, `h2.result__title > a.result__a`
//!   whose `href` goes through the `//duckduckgo.com/l/?uddg=` redirector,
//!   `a.result__snippet` with `<b>` marks, `a.result__url`, and an ad (`result--ad`) first.
//!   The markup follows the live page's structure as seen in its HTML; no public project's
//!   test data with a whole stored page was found to reuse.

use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::server::{self, Server, WaitTimeout, at_least};

/// One scripted answer: a status, headers and a body.
#[derive(Debug, Clone)]
pub struct FakePage {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl FakePage {
    /// A `200` with `content_type` and `body`.
    pub fn new(content_type: &str, body: impl Into<Bytes>) -> Self {
        FakePage {
            status: 200,
            headers: vec![("content-type".to_owned(), content_type.to_owned())],
            body: body.into(),
        }
    }

    /// A `200` HTML page in UTF-8.
    pub fn html(body: impl Into<String>) -> Self {
        Self::new("text/html; charset=utf-8", body.into())
    }

    /// A `200` JSON answer.
    pub fn json(value: &Value) -> Self {
        Self::new("application/json", value.to_string())
    }

    /// A `200` with `body` and no `Content-Type` at all.
    pub fn untyped(body: impl Into<Bytes>) -> Self {
        FakePage {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// An empty answer with `status` (a provider's `429`, `500`).
    pub fn status(status: u16) -> Self {
        FakePage {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    /// A redirect (`301`, `302`, `307`...) to `location`.
    pub fn redirect(status: u16, location: &str) -> Self {
        Self::status(status).header("location", location)
    }

    /// `size` bytes of an HTML page: a paragraph repeated until the size is reached.
    pub fn large_html(size: usize) -> Self {
        let unit = b"<p>All work and no play makes a long page. </p>\n";
        let mut body = b"<!DOCTYPE html><html><head><title>Long</title></head><body>".to_vec();
        while body.len() < size {
            body.extend_from_slice(unit);
        }
        body.truncate(size);
        Self::new("text/html", body)
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
}

/// One recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebRequest {
    /// The path, without the query.
    pub path: String,
    /// The decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    /// The request headers, names lower case.
    pub headers: Vec<(String, String)>,
}

impl WebRequest {
    /// The first query parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first header called `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Pages {
    pages: HashMap<String, FakePage>,
    requests: Vec<WebRequest>,
}

struct Shared {
    state: Mutex<Pages>,
    recorded: Notify,
}

/// A running fake web host; it stops on [`FakeWeb::shutdown`] or when dropped.
pub struct FakeWeb {
    shared: Arc<Shared>,
    addr: SocketAddr,
    server: Server,
}

impl fmt::Debug for FakeWeb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeWeb")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl FakeWeb {
    /// Starts a host on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If no local port can be bound.
    pub async fn start() -> Self {
        Self::start_on(Ipv4Addr::LOCALHOST).await
    }

    /// Starts a host on `ip:0`, an address of 127.0.0.0/8 (`127.0.0.2` is a second host).
    ///
    /// # Panics
    /// If `ip` is not a loopback address (tests never listen elsewhere) or cannot be bound.
    pub async fn start_on(ip: Ipv4Addr) -> Self {
        assert!(ip.is_loopback(), "fake web: {ip} is not a loopback address");
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .unwrap_or_else(|e| panic!("fake web: cannot bind {ip}:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fake web: no local address: {e}"));
        let shared = Arc::new(Shared {
            state: Mutex::new(Pages::default()),
            recorded: Notify::new(),
        });
        let app = Router::new()
            .fallback(serve_page)
            .with_state(Arc::clone(&shared));
        let mut server = Server::new(CancellationToken::new());
        server.serve(listener, app);
        FakeWeb {
            shared,
            addr,
            server,
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (no trailing slash): a search provider's base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Serves `page` at `path` (the query is ignored when matching), replacing any page
    /// there. Unknown paths answer `404`.
    pub fn page(&self, path: &str, page: FakePage) {
        server::lock(&self.shared.state)
            .pages
            .insert(path.to_owned(), page);
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<WebRequest> {
        server::lock(&self.shared.state).requests.clone()
    }

    /// The requests for `path` so far.
    pub fn requests_to(&self, path: &str) -> Vec<WebRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// Waits until at least `n` requests were received; gives up after `timeout`.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WebRequest>, WaitTimeout> {
        server::wait_until("web", &self.shared.recorded, timeout, || {
            at_least(&server::lock(&self.shared.state).requests, n, "request(s)")
        })
        .await
    }

    /// Stops the server and waits (bounded) for it.
    pub async fn shutdown(mut self) {
        self.server.shutdown().await;
    }
}

async fn serve_page(State(shared): State<Arc<Shared>>, request: Request<Body>) -> Response {
    let path = request.uri().path().to_owned();
    let query = request
        .uri()
        .query()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let page = {
        let mut state = server::lock(&shared.state);
        state.requests.push(WebRequest {
            path: path.clone(),
            query,
            headers,
        });
        state.pages.get(&path).cloned()
    };
    shared.recorded.notify_waiters();
    let page = page.unwrap_or_else(|| FakePage::status(404));
    let mut response = Response::new(Body::from(page.body));
    *response.status_mut() =
        StatusCode::from_u16(page.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in page.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// One search result for the provider fakes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    /// The title.
    pub title: String,
    /// The URL.
    pub url: String,
    /// The excerpt.
    pub snippet: String,
    /// The publication date (ISO 8601), if any.
    pub published: Option<String>,
}

impl SearchHit {
    /// A result without a date.
    pub fn new(title: &str, url: &str, snippet: &str) -> Self {
        SearchHit {
            title: title.to_owned(),
            url: url.to_owned(),
            snippet: snippet.to_owned(),
            published: None,
        }
    }

    /// With a publication date.
    pub fn published(mut self, date: &str) -> Self {
        self.published = Some(date.to_owned());
        self
    }
}

fn host_of(url: &str) -> &str {
    url.split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or(url)
}

/// SearXNG's JSON answer for `query` with `hits`.
pub fn searxng_json(query: &str, hits: &[SearchHit]) -> Value {
    let results: Vec<Value> = hits
        .iter()
        .enumerate()
        .map(|(i, h)| {
            json!({
                "url": h.url,
                "title": h.title,
                "content": h.snippet,
                "publishedDate": h.published,
                "thumbnail": "",
                "engine": "duckduckgo",
                "template": "default.html",
                "parsed_url": ["https", host_of(&h.url), "/", "", "", ""],
                "img_src": "",
                "priority": "",
                "engines": ["duckduckgo", "brave"],
                "positions": [i + 1],
                "score": 2.0 / (i as f64 + 1.0),
                "category": "general"
            })
        })
        .collect();
    json!({
        "query": query,
        "number_of_results": 0,
        "results": results,
        "answers": [],
        "corrections": [],
        "infoboxes": [],
        "suggestions": [],
        "unresponsive_engines": []
    })
}

/// The Brave Search API's answer for `query` with `hits`.
pub fn brave_json(query: &str, hits: &[SearchHit]) -> Value {
    let results: Vec<Value> = hits
        .iter()
        .map(|h| {
            let mut result = json!({
                "title": h.title,
                "url": h.url,
                "is_source_local": false,
                "is_source_both": false,
                "description": format!("<strong>{}</strong>", h.snippet),
                "language": "en",
                "family_friendly": true,
                "type": "search_result",
                "subtype": "generic",
                "is_live": false,
                "meta_url": {
                    "scheme": "https",
                    "netloc": host_of(&h.url),
                    "hostname": host_of(&h.url),
                    "favicon": "",
                    "path": ""
                }
            });
            if let Some(date) = &h.published {
                result["page_age"] = json!(date);
                result["age"] = json!(date);
            }
            result
        })
        .collect();
    json!({
        "query": {"original": query, "show_strict_warning": false, "is_navigational": false,
                  "spellcheck_off": true, "country": "us", "more_results_available": true},
        "mixed": {"type": "mixed", "main": [], "top": [], "side": []},
        "type": "search",
        "web": {"type": "search", "results": results, "family_friendly": true}
    })
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// DuckDuckGo's HTML result page for `query` with `hits` (an ad first, then the results);
/// no hits gives its "No results." page.
pub fn duckduckgo_html(query: &str, hits: &[SearchHit]) -> String {
    let q = escape(query);
    let mut body = String::new();
    body.push_str(
        r#"<div class="result results_links results_links_deep result--ad ">
  <div class="links_main links_deep result__body">
    <h2 class="result__title"><a rel="nofollow" class="result__a" href="https://duckduckgo.com/y.js?ad_domain=ads.example&amp;ad_provider=bingv7aa">Buy Things Now</a></h2>
    <a class="result__snippet" href="https://duckduckgo.com/y.js?ad_domain=ads.example">Sponsored <b>offer</b>.</a>
  </div>
</div>
"#,
    );
    for hit in hits {
        let encoded: String = form_urlencoded::byte_serialize(hit.url.as_bytes()).collect();
        // DuckDuckGo marks the query's words in bold; the first word stands in for them.
        let escaped = escape(&hit.snippet);
        let snippet = match escaped.split_once(' ') {
            Some((first, rest)) => format!("<b>{first}</b> {rest}"),
            None => escaped,
        };
        body.push_str(&format!(
            r#"<div class="result results_links results_links_deep web-result ">
  <div class="links_main links_deep result__body">
    <h2 class="result__title">
      <a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg={encoded}&amp;rut=2f7c0e1d">{title}</a>
    </h2>
    <div class="result__extras">
      <div class="result__extras__url">
        <span class="result__icon"><a rel="nofollow" href="//duckduckgo.com/l/?uddg={encoded}&amp;rut=2f7c0e1d"><img class="result__icon__img" width="16" height="16" alt="" src="//external-content.duckduckgo.com/ip3/{host}.ico" name="i15" /></a></span>
        <a class="result__url" href="//duckduckgo.com/l/?uddg={encoded}&amp;rut=2f7c0e1d">{host}</a>
      </div>
    </div>
    <a class="result__snippet" href="//duckduckgo.com/l/?uddg={encoded}&amp;rut=2f7c0e1d">{snippet}</a>
    <div class="clear"></div>
  </div>
</div>
"#,
            title = escape(&hit.title),
            host = escape(host_of(&hit.url)),
        ));
    }
    if hits.is_empty() {
        body.push_str(r#"<div class="no-results">No results.</div>"#);
    }
    format!(
        r#"<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01 Transitional//EN" "http://www.w3.org/TR/html4/loose.dtd">
<html>
<head>
  <meta http-equiv="content-type" content="text/html; charset=UTF-8">
  <meta name="referrer" content="origin">
  <title>{q} at DuckDuckGo</title>
  <link rel="stylesheet" href="/dist/h.css" type="text/css">
</head>
<body class="body--html">
  <div class="header_wrap" id="header_wrapper">
    <form name="x" class="header__form" action="/html/" method="post">
      <input name="q" autocomplete="off" class="search__input" id="search_form_input_homepage" type="text" value="{q}" />
    </form>
  </div>
  <div>
    <div class="serp__results">
      <div id="links" class="results">
{body}
        <div class="nav-link">
          <form action="/html/" method="post"><input type="submit" class="btn btn--alt" value="Next" /><input type="hidden" name="q" value="{q}" /><input type="hidden" name="s" value="10" /></form>
        </div>
      </div>
    </div>
  </div>
</body>
</html>
"#
    )
}
