//! Image references in a request: what the model is shown of the photos members attach.
//!
//! History holds images only as [`ContentPart::ImageRef`] (a platform file id), never as
//! bytes, so a photo does not ride along in every later request and the store stays small.
//! When the agent builds a request:
//! - a reference in the **current turn** becomes a `data:` URL: downloaded through the
//!   chat's [`Platform::download_image`] (with a timeout), checked and downscaled by the
//!   [`crate::image`] pipeline, once per turn (`TurnImages` caches it for the turn's later
//!   iterations). A download that fails, an image over the limit or of an unknown format
//!   becomes a text part saying so: the turn goes on without it;
//! - a reference in an **older turn** becomes a short text naming the message, so the model
//!   can ask `load_image` for it again; so does a `data:` URL in history (written before
//!   references existed, or by `load_image`);
//! - **without vision**, references become the note that images were attached and the model
//!   cannot see them, and no image is downloaded; unless **vision models** are configured
//!   ([`VisionModel`], `[[llm.vision_models]]`): then the current turn's images (attached or
//!   added by `load_image`) are downloaded as above and described by the first of them that
//!   answers, and the description takes the image's place, in the request and in the
//!   stored turn (so later turns still know what the image showed). A cancelled turn is not
//!   a failure: no further model is asked. With every model failing, the note says so.
//!
//! [`strip_image_data`] is the storage side: the session layer runs it on history before it
//! commits, so the `data:` URLs of a turn (`load_image`'s) do not outlive the turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::image::{self, ImageError};
use crate::llm::{
    ChatRequest, Content, ContentPart, ImageUrl, LlmBackend, LlmError, Message, Spend,
};
use crate::platform::{ImageRef, Platform, PlatformError};

/// A model that can see, asked to describe images for a main model that cannot.
#[derive(Clone)]
pub struct VisionModel {
    /// Model name sent with the request.
    pub model: String,
    /// Its endpoint.
    pub llm: Arc<dyn LlmBackend>,
}

impl std::fmt::Debug for VisionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionModel")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

/// What a vision model is asked (as the system message).
pub const DESCRIBE_PROMPT: &str = "You describe images for an assistant that cannot see \
them. Describe this image in at most 120 words: what it shows, any text in it (quoted \
exactly), numbers, charts or code, and anything unusual. Say only what you see.";

/// Longest description kept, in characters.
const MAX_DESCRIPTION_CHARS: usize = 1500;

/// How images reach the model. Defaults: vision off; the pipeline's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageOptions {
    /// Whether the model sees images (`llm.vision`); without it nothing is downloaded.
    pub vision: bool,
    /// Largest image downloaded, in bytes.
    pub max_bytes: u64,
    /// Longest side, in pixels, of an image sent; larger ones are scaled down.
    pub max_side: u32,
    /// Longest wait for one download from the platform.
    pub download_timeout: Duration,
    /// Most attached images shown in one turn; more would crowd out the conversation.
    pub max_per_turn: usize,
}

impl Default for ImageOptions {
    fn default() -> Self {
        ImageOptions {
            vision: false,
            max_bytes: image::DEFAULT_MAX_BYTES,
            max_side: image::DEFAULT_MAX_SIDE,
            download_timeout: Duration::from_secs(30),
            max_per_turn: 4,
        }
    }
}

/// The images of one turn: each reference resolved at most once, whatever the number of
/// iterations, so a photo is downloaded and prepared once per turn.
pub(super) struct TurnImages {
    options: ImageOptions,
    platform: Option<Arc<dyn Platform>>,
    /// Who describes images when the model cannot see them (empty: nobody).
    describers: Arc<[VisionModel]>,
    /// By platform file id: the part that stands for the image in this turn's requests.
    resolved: HashMap<String, ContentPart>,
    /// How many images are shown (not replaced by a text) so far.
    shown: usize,
    /// The vision models' tokens not yet taken into the turn ([`TurnImages::take_spent`]).
    /// A mutex because descriptions run concurrently.
    spent: Mutex<Spend>,
}

impl TurnImages {
    pub(super) fn new(
        options: ImageOptions,
        platform: Option<Arc<dyn Platform>>,
        describers: Arc<[VisionModel]>,
    ) -> Self {
        TurnImages {
            options,
            platform,
            describers,
            resolved: HashMap::new(),
            shown: 0,
            spent: Mutex::new(Spend::default()),
        }
    }

    /// The vision models' tokens since the last call: the turn counts them like its own.
    pub(super) fn take_spent(&self) -> Spend {
        std::mem::take(&mut *self.spent.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Resolves every reference in `messages` that is not resolved yet. Downloads run
    /// concurrently; a cancelled turn stops waiting for them and caches nothing of them.
    pub(super) async fn load(&mut self, messages: &[Message], cancel: &CancellationToken) {
        if !self.options.vision && self.describers.is_empty() {
            return;
        }
        if !self.options.vision {
            self.describe_urls(messages, cancel).await;
        }
        let mut wanted: Vec<(&ImageRef, Option<&str>)> = Vec::new();
        for (image, message_id) in refs(messages) {
            if self.resolved.contains_key(&image.file_id)
                || wanted.iter().any(|(w, _)| w.file_id == image.file_id)
            {
                continue;
            }
            wanted.push((image, message_id));
        }
        let room = self.options.max_per_turn.saturating_sub(self.shown);
        let extra = wanted.split_off(room.min(wanted.len()));
        let this = &*self;
        let fetches: Vec<_> = wanted
            .into_iter()
            .map(|(image, message_id)| async move {
                (image, this.resolve(image, message_id, cancel).await)
            })
            .collect();
        let results = tokio::select! {
            results = futures::future::join_all(fetches) => results,
            () = cancel.cancelled() => return,
        };
        for (image, part) in results {
            if matches!(part, ContentPart::ImageUrl { .. }) || !self.options.vision {
                self.shown += 1;
            }
            self.resolved.insert(image.file_id.clone(), part);
        }
        for (image, message_id) in extra {
            let text = format!(
                "[{} is not shown: at most {} attached images are shown in one turn; \
                 load_image can show it]",
                which(message_id),
                self.options.max_per_turn
            );
            self.resolved
                .insert(image.file_id.clone(), ContentPart::Text { text });
        }
    }

    /// One reference: a `data:` URL part (or, for a model without vision, its
    /// description), or a text part saying why not.
    async fn resolve(
        &self,
        image: &ImageRef,
        message_id: Option<&str>,
        cancel: &CancellationToken,
    ) -> ContentPart {
        match self.prepare(image).await {
            Ok(prepared) if self.options.vision => ContentPart::ImageUrl {
                image_url: ImageUrl {
                    url: prepared.data_url(),
                    detail: None,
                },
            },
            Ok(prepared) => ContentPart::Text {
                text: self
                    .describe(&prepared.data_url(), &which(message_id), cancel)
                    .await,
            },
            Err(why) => {
                tracing::warn!(file = %image.file_id, reason = %why, "an attached image is not shown");
                ContentPart::Text {
                    text: format!("[{} could not be shown: {why}]", which(message_id)),
                }
            }
        }
    }

    async fn prepare(&self, image: &ImageRef) -> Result<image::Prepared, Unshown> {
        let max = self.options.max_bytes;
        if image.size.is_some_and(|size| size > max) {
            return Err(Unshown::TooLarge(max));
        }
        let Some(platform) = &self.platform else {
            return Err(Unshown::NoPlatform);
        };
        let timeout = self.options.download_timeout;
        let bytes = match tokio::time::timeout(timeout, platform.download_image(image)).await {
            Err(_) => return Err(Unshown::TimedOut(timeout)),
            Ok(Err(error)) => {
                tracing::warn!(file = %image.file_id, %error, "image download failed");
                return Err(match error {
                    PlatformError::RateLimited(_) => Unshown::RateLimited,
                    PlatformError::NotFound(_) => Unshown::Gone,
                    _ => Unshown::NotDelivered,
                });
            }
            Ok(Ok(bytes)) => bytes,
        };
        if bytes.len() as u64 > max {
            return Err(Unshown::TooLarge(max));
        }
        Ok(image::prepare_blocking(bytes, self.options.max_side).await?)
    }

    /// Images a tool added to the current turn (`load_image`'s `data:` URLs), described for
    /// a model without vision.
    async fn describe_urls(&mut self, messages: &[Message], cancel: &CancellationToken) {
        let mut urls: Vec<&str> = Vec::new();
        for message in messages {
            if let Message::User {
                content: Content::Parts(parts),
            } = message
            {
                for part in parts {
                    if let ContentPart::ImageUrl { image_url } = part
                        && !self.resolved.contains_key(&image_url.url)
                        && !urls.contains(&image_url.url.as_str())
                    {
                        urls.push(&image_url.url);
                    }
                }
            }
        }
        for url in urls {
            let text = tokio::select! {
                text = self.describe(url, "the image a tool loaded", cancel) => text,
                () = cancel.cancelled() => return,
            };
            self.resolved
                .insert(url.to_owned(), ContentPart::Text { text });
        }
    }

    /// A description of the image at `url` by the first vision model that gives one, or a
    /// note that none could. `what` names the image for the model.
    async fn describe(&self, url: &str, what: &str, cancel: &CancellationToken) -> String {
        let request = |model: &str| ChatRequest {
            model: model.to_owned(),
            messages: vec![
                Message::system(DESCRIBE_PROMPT),
                Message::User {
                    content: Content::Parts(vec![ContentPart::ImageUrl {
                        image_url: ImageUrl {
                            url: url.to_owned(),
                            detail: None,
                        },
                    }]),
                },
            ],
            tools: Default::default(),
            tool_choice: None,
            parallel_tool_calls: None,
            temperature: None,
            max_completion_tokens: Some(400),
            prompt_cache_key: None,
        };
        for describer in self.describers.iter() {
            let answer = describer
                .llm
                .stream(&request(&describer.model), cancel)
                .await;
            if let Ok(completion) = &answer
                && let Some(usage) = &completion.usage
            {
                let model = completion.model.as_deref().unwrap_or(&describer.model);
                self.spent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .add(model, usage);
            }
            match answer {
                Ok(completion) if !completion.content.trim().is_empty() => {
                    let text: String = completion
                        .content
                        .trim()
                        .chars()
                        .take(MAX_DESCRIPTION_CHARS)
                        .collect();
                    // The picture's text (a sign, a screenshot of a chat) is whoever made
                    // it: quoted, so no line of it passes for an attributed message.
                    return format!(
                        "[{what}, described by a vision model (you cannot see images yourself), \
                         quoted:\n{}\n]",
                        crate::quote::block(&text)
                    );
                }
                // The turn is ending: asking the next model would be wasted.
                Err(LlmError::Cancelled) => return format!("[{what} was not loaded]"),
                Ok(_) => {
                    tracing::warn!(model = %describer.model, "a vision model gave an empty description");
                }
                Err(error) => {
                    tracing::warn!(model = %describer.model, %error, "a vision model could not describe an image");
                }
            }
        }
        format!(
            "[{what} is attached, but this model cannot see images and no vision model could describe it]"
        )
    }

    /// Whether images are described for a model without vision.
    pub(super) fn describes(&self) -> bool {
        !self.options.vision && !self.describers.is_empty()
    }

    /// A message of the current turn as it is sent: references replaced by what
    /// [`TurnImages::load`] resolved them to (for a model without vision that has them
    /// described, tools' images too).
    pub(super) fn current(&self, message: &Message) -> Message {
        let describes = self.describes();
        if !self.options.vision && !describes {
            return without_vision(message, false);
        }
        // Not resolved: the turn was cancelled while it downloaded.
        let resolved = |key: &str, what: &str| {
            self.resolved
                .get(key)
                .cloned()
                .unwrap_or_else(|| ContentPart::Text {
                    text: format!("[{what} was not loaded]"),
                })
        };
        map_parts(message, |part| match part {
            ContentPart::ImageRef { image, message_id } => {
                Some(resolved(&image.file_id, &which(message_id.as_deref())))
            }
            ContentPart::ImageUrl { image_url } if describes => {
                Some(resolved(&image_url.url, "an image"))
            }
            _ => None,
        })
    }
}

/// A message of an older turn as it is sent: no image bytes, only what the model needs to
/// know an image was there.
pub(super) fn earlier(message: &Message, vision: bool) -> Message {
    if !vision {
        return without_vision(message, true);
    }
    map_parts(message, |part| match part {
        ContentPart::ImageRef { message_id, .. } => Some(ContentPart::Text {
            text: match message_id {
                Some(id) => format!("[image from message {id}; load_image can show it again]"),
                None => "[an image was attached here; it is not shown again]".to_owned(),
            },
        }),
        ContentPart::ImageUrl { image_url } if is_data_url(&image_url.url) => Some(shown_earlier()),
        _ => None,
    })
}

/// Replaces every `data:` URL in `history` by a short text, so that what is stored holds no
/// image bytes (they were needed only by the turn that loaded them).
pub fn strip_image_data(history: &mut [Message]) {
    for message in history {
        if let Message::User {
            content: Content::Parts(parts),
        } = message
        {
            for part in parts.iter_mut() {
                if let ContentPart::ImageUrl { image_url } = part
                    && is_data_url(&image_url.url)
                {
                    *part = shown_earlier();
                }
            }
        }
    }
}

fn shown_earlier() -> ContentPart {
    ContentPart::Text {
        text: "[an image was shown here earlier; load_image can show it again]".to_owned(),
    }
}

fn is_data_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:"))
}

/// For a model without vision: the message without its images and with one note counting
/// them, as plain text content when only text is left (a provider without vision may refuse
/// content parts altogether). References always count; image URLs only when `also_urls`
/// (in older turns: in the current one, an image a tool added is the tool's business).
fn without_vision(message: &Message, also_urls: bool) -> Message {
    let Message::User {
        content: Content::Parts(parts),
    } = message
    else {
        return message.clone();
    };
    let hidden = |p: &ContentPart| match p {
        ContentPart::ImageRef { .. } => true,
        ContentPart::ImageUrl { .. } => also_urls,
        ContentPart::Text { .. } => false,
    };
    let images = parts.iter().filter(|p| hidden(p)).count();
    if images == 0 {
        return message.clone();
    }
    let mut kept: Vec<ContentPart> = parts.iter().filter(|p| !hidden(p)).cloned().collect();
    kept.push(ContentPart::Text {
        text: format!(
            "[{images} image{} attached; this model cannot see images]",
            if images == 1 { "" } else { "s" }
        ),
    });
    let content = if kept.iter().all(|p| matches!(p, ContentPart::Text { .. })) {
        Content::Text(Content::Parts(kept).text())
    } else {
        Content::Parts(kept)
    };
    Message::User { content }
}

/// `message` with each part that `f` maps replaced. Content left with text parts only
/// becomes plain text, the form every provider takes.
fn map_parts(message: &Message, f: impl Fn(&ContentPart) -> Option<ContentPart>) -> Message {
    let Message::User {
        content: Content::Parts(parts),
    } = message
    else {
        return message.clone();
    };
    let mut replaced = false;
    let parts: Vec<ContentPart> = parts
        .iter()
        .map(|p| match f(p) {
            Some(new) => {
                replaced = true;
                new
            }
            None => p.clone(),
        })
        .collect();
    let content = if replaced && parts.iter().all(|p| matches!(p, ContentPart::Text { .. })) {
        Content::Text(Content::Parts(parts).text())
    } else {
        Content::Parts(parts)
    };
    Message::User { content }
}

/// Every image reference in `messages`, in order, with the message it is attached to.
fn refs(messages: &[Message]) -> Vec<(&ImageRef, Option<&str>)> {
    let mut out = Vec::new();
    for message in messages {
        if let Message::User {
            content: Content::Parts(parts),
        } = message
        {
            for part in parts {
                if let ContentPart::ImageRef { image, message_id } = part {
                    out.push((image, message_id.as_deref()));
                }
            }
        }
    }
    out
}

fn which(message_id: Option<&str>) -> String {
    match message_id {
        Some(id) => format!("the image of message {id}"),
        None => "an attached image".to_owned(),
    }
}

/// Why an attached image is not shown; the text completes "[the image … could not be shown:
/// …]" for the model.
#[derive(Debug, thiserror::Error)]
enum Unshown {
    #[error("it is larger than the limit of {}", megabytes(*.0))]
    TooLarge(u64),
    #[error("this conversation is not attached to a chat platform")]
    NoPlatform,
    #[error("the platform did not deliver it within {} s", .0.as_secs_f64())]
    TimedOut(Duration),
    #[error("the platform is rate limiting downloads just now")]
    RateLimited,
    #[error("the platform no longer has it")]
    Gone,
    #[error("the platform could not deliver it")]
    NotDelivered,
    #[error(transparent)]
    Image(#[from] ImageError),
}

fn megabytes(bytes: u64) -> String {
    if bytes >= 1024 * 1024 {
        format!("{} MB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripping_replaces_data_urls_and_keeps_references_and_web_urls() {
        let part = |url: &str| ContentPart::ImageUrl {
            image_url: ImageUrl {
                url: url.to_owned(),
                detail: None,
            },
        };
        let reference = ContentPart::ImageRef {
            image: ImageRef {
                file_id: "f1".into(),
                mime_type: None,
                size: None,
            },
            message_id: Some("7".into()),
        };
        let mut history = vec![Message::User {
            content: Content::Parts(vec![
                part("data:image/png;base64,AAAA"),
                part("DATA:image/jpeg;base64,BBBB"),
                part("https://example.com/a.png"),
                reference.clone(),
            ]),
        }];
        strip_image_data(&mut history);
        assert_eq!(
            history,
            [Message::User {
                content: Content::Parts(vec![
                    shown_earlier(),
                    shown_earlier(),
                    part("https://example.com/a.png"),
                    reference,
                ]),
            }]
        );
    }
}
