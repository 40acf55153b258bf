//! Keeping a session's history within its token budget. Trimming drops the oldest whole
//! turns: it cuts only in front of a user message, so an assistant's tool calls are never
//! separated from their results.

use crate::llm::{Content, ContentPart, Message};

/// A cheap token estimate: about four characters per token plus a little per message.
/// Providers count differently; the budget leaves room for the difference.
pub fn estimate_tokens(message: &Message) -> usize {
    let chars = match message {
        Message::System { content } => content.chars().count(),
        Message::User { content } => match content {
            Content::Text(text) => text.chars().count(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match p {
                    ContentPart::Text { text } => text.chars().count(),
                    // Providers bill an image at a few hundred tokens at low detail.
                    ContentPart::ImageUrl { .. } => 3000,
                    // Past its own turn a reference is sent as one short line of text.
                    ContentPart::ImageRef { .. } => 60,
                })
                .sum(),
        },
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            content.as_deref().map_or(0, |c| c.chars().count())
                + tool_calls
                    .iter()
                    .map(|c| c.function.name.len() + c.function.arguments.chars().count() + 20)
                    .sum::<usize>()
        }
        Message::Tool { content, .. } => content.chars().count(),
    };
    chars / 4 + 4
}

/// Where each turn of `history` starts: the index of every user message. Cutting only there
/// keeps an assistant's tool calls with their results.
pub fn turn_starts(history: &[Message]) -> Vec<usize> {
    history
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::User { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// Drops the oldest turns until the history fits `budget` tokens. The newest turn is kept
/// even when it alone is larger; the result always starts with a user message.
pub fn trim_to_budget(history: &mut Vec<Message>, budget: usize) {
    let mut total: usize = history.iter().map(estimate_tokens).sum();
    let mut cut = 0;
    // Candidate cut points: every user message after the first.
    let starts = turn_starts(history);
    for &start in starts.iter().skip(1) {
        if total <= budget {
            break;
        }
        total -= history[cut..start]
            .iter()
            .map(estimate_tokens)
            .sum::<usize>();
        cut = start;
    }
    // A history that does not begin with a user message (written by an older version, or
    // damaged) is cut to its first user message so the provider never sees orphan tool
    // results.
    if cut == 0 {
        cut = starts.first().copied().unwrap_or(history.len());
    }
    history.drain(..cut);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn turn(i: usize, size: usize) -> Vec<Message> {
        vec![
            Message::user(format!("user {i} {}", "x".repeat(size))),
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall::new(format!("c{i}"), "time_now", "{}")],
                thinking: Vec::new(),
                model: None,
            },
            Message::tool(format!("c{i}"), "y".repeat(size)),
            Message::assistant(format!("answer {i}")),
        ]
    }

    #[test]
    fn trimming_drops_whole_old_turns_and_keeps_pairs_together() {
        let mut history: Vec<Message> = (0..10).flat_map(|i| turn(i, 400)).collect();
        let total: usize = history.iter().map(estimate_tokens).sum();
        trim_to_budget(&mut history, total / 2);
        assert!(history.iter().map(estimate_tokens).sum::<usize>() <= total / 2);
        assert!(
            matches!(&history[0], Message::User { content } if content.text().starts_with("user 5"))
        );
        assert_eq!(history.len() % 4, 0, "whole turns only");
        for pair in history.chunks(4) {
            let Message::Assistant { tool_calls, .. } = &pair[1] else {
                panic!("turn shape broken: {pair:?}");
            };
            assert!(
                matches!(&pair[2], Message::Tool { tool_call_id, .. } if *tool_call_id == tool_calls[0].id)
            );
        }
    }

    #[test]
    fn the_newest_turn_stays_even_when_it_alone_is_too_big() {
        let mut history: Vec<Message> = (0..3).flat_map(|i| turn(i, 10_000)).collect();
        trim_to_budget(&mut history, 10);
        assert_eq!(history.len(), 4);
        assert!(
            matches!(&history[0], Message::User { content } if content.text().starts_with("user 2"))
        );
    }

    #[test]
    fn a_history_not_starting_with_a_user_message_is_repaired() {
        let mut history = vec![Message::tool("orphan", "result"), Message::assistant("x")];
        history.extend(turn(1, 10));
        trim_to_budget(&mut history, 1_000_000);
        assert!(matches!(history[0], Message::User { .. }));
        assert_eq!(history.len(), 4);
    }
}
