//! The model's Markdown -> Discord message parts.
//!
//! [`render_parts`] is the single entry point the adapter sends through; it delegates to the
//! runtime's Discord renderer (`parlor_render::discord`): Discord's own Markdown subset,
//! everything else escaped, parts of at most [`MAX_MESSAGE_CHARS`] (UTF-16 units, never fewer
//! than characters) with code fences and other markers closed and reopened across a cut, and
//! `@everyone`/`@here`/role mentions defused unless mass mentions are allowed.

use parlor_render::discord::{DiscordOptions, render};

pub use parlor_render::discord::MAX_MESSAGE_CHARS;

/// Renders `text` for Discord as message parts; blank text gives no parts.
pub fn render_parts(text: &str, allow_mass_mentions: bool) -> Vec<String> {
    render(
        text,
        DiscordOptions {
            allow_mass_mentions,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_fit_and_blank_text_gives_none() {
        assert!(render_parts("  \n ", false).is_empty());
        assert_eq!(render_parts("hello", false), vec!["hello".to_owned()]);
        let text = "word ".repeat(2000);
        let parts = render_parts(&text, false);
        assert!(parts.len() >= 5);
        for part in &parts {
            assert!(part.encode_utf16().count() <= MAX_MESSAGE_CHARS);
        }
    }

    #[test]
    fn mass_mentions_are_defused_unless_allowed() {
        let quiet = render_parts("@everyone look", false).concat();
        assert!(!quiet.contains("@everyone"), "{quiet:?}");
        assert!(
            render_parts("@everyone look", true)
                .concat()
                .contains("@everyone")
        );
    }
}
