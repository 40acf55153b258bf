//! What the black-box tests of every fake share.

use std::time::Duration;

/// How long a test waits for something the fake should see soon.
pub const WAIT: Duration = Duration::from_secs(5);

/// An HTTP client that gives up instead of hanging a test on a stuck fake.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("reqwest client")
}
