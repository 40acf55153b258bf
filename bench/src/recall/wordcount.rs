//! The scorer `memory_search` used before BM25, kept here only to compare: a copy of
//! `words`, `query_terms`, `matches` and `score` from `toolsets/src/memory.rs` as of the
//! commit before 9865e26, and the ranking its `search` made of them. Same behaviour, not
//! to be improved: it is the baseline.
//!
//! The score: for each distinct query word found in the entry,
//! `3 × min(count in the key, 3) + min(count in the content, 5) + 2`; a query word of 3 or more characters matches the
//! words it begins, a shorter one only itself; the whole query standing as a phrase adds 6
//! in the key and 4 in the content. Entries scoring 0 are left out; ties keep the order the
//! entries come in (most recently updated first).

use std::cmp::Reverse;

/// The words of `text`: lower case, split at anything not a letter or digit, each with the
/// byte offset where it starts in `text`.
fn words(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, text[s..i].to_lowercase()));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text[s..].to_lowercase()));
    }
    out
}

/// The distinct words of a query, in order.
fn query_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for (_, word) in words(query) {
        if !terms.contains(&word) {
            terms.push(word);
        }
    }
    terms
}

/// Whether the query word `term` matches the text word `word` (prefix match for query words
/// of 3 or more characters).
fn matches(term: &str, word: &str) -> bool {
    if term.chars().count() >= 3 {
        word.starts_with(term)
    } else {
        word == term
    }
}

/// The score of the module docs (the old `Score::total`; what it matched is not needed
/// here).
fn score(terms: &[String], key: &str, content: &str) -> u32 {
    let key_words = words(key);
    let content_words = words(content);
    let count = |words: &[(usize, String)], term: &str| -> u32 {
        let n = words.iter().filter(|(_, w)| matches(term, w)).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    };
    let mut total = 0;
    let mut matched = 0;
    for term in terms {
        let in_key = count(&key_words, term);
        let in_content = count(&content_words, term);
        if in_key + in_content > 0 {
            total += 3 * in_key.min(3) + in_content.min(5) + 2;
            matched += 1;
        }
    }
    if terms.len() >= 2 && matched > 0 {
        let joined = |words: &[(usize, String)]| {
            let text: Vec<&str> = words.iter().map(|(_, w)| w.as_str()).collect();
            format!(" {} ", text.join(" "))
        };
        let needle = format!(" {} ", terms.join(" "));
        if joined(&key_words).contains(&needle) {
            total += 6;
        }
        if joined(&content_words).contains(&needle) {
            total += 4;
        }
    }
    total
}

/// The keys the old `memory_search` returned for `query`, best first, at most `limit`:
/// `docs` are (key, content) in the toolset's order, most recently updated first. A query
/// without words finds nothing (the old tool refused it).
pub fn search(docs: &[(String, String)], query: &str, limit: usize) -> Vec<String> {
    let terms = query_terms(query);
    if terms.is_empty() {
        return Vec::new();
    }
    let mut hits: Vec<(u32, &str)> = docs
        .iter()
        .filter_map(|(key, content)| {
            let score = score(&terms, key, content);
            (score > 0).then_some((score, key.as_str()))
        })
        .collect();
    // Stable: ties keep the toolset's order.
    hits.sort_by_key(|(score, _)| Reverse(*score));
    hits.into_iter()
        .take(limit)
        .map(|(_, key)| key.to_owned())
        .collect()
}
