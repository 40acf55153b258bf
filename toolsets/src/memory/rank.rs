//! BM25 over a chat's memory entries, from an inverted index ([`Index`]) built from the
//! store's entries, and the fusion of its ranking with an embedding ranking ([`fuse`]).
//!
//! Terms: lower-case words split at anything that is not a letter or digit, lightly
//! stemmed (`birthdays`, `booked`, `booking` → `birthday`, `book`, `book`), and CJK text, which
//! has no spaces, as single characters and overlapping pairs (`生日快乐` → `生`, `日`, `快`,
//! `乐`, `生日`, `日快`, `快乐`). A query term of four or more characters also matches terms
//! it begins (`birth` finds `birthday`). The key's terms count twice: a key names its topic.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

/// Words too common to find an entry by: left out of a search's terms (unless nothing else
/// is left) and of the words recall matches.
pub(super) const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "you", "your", "what", "when", "where", "who", "how", "why", "are", "was",
    "were", "with", "this", "that", "have", "has", "had", "not", "but", "can", "could", "would",
    "should", "will", "about", "from", "they", "them", "there", "their", "our", "just", "please",
    "remember", "know", "tell", "does", "did", "parlor", "bot", "any", "all", "which", "whose",
    "is", "it", "at", "in", "on", "of", "to", "we", "do", "me", "my", "be", "or", "an", "a", "i",
];

/// [`STOP_WORDS`] as terms (stemmed).
static STOP_TERMS: LazyLock<Vec<String>> =
    LazyLock::new(|| STOP_WORDS.iter().map(|w| stem(w)).collect());

/// BM25's term-frequency saturation.
const K1: f64 = 1.2;
/// BM25's length normalization.
const B: f64 = 0.75;

/// One entry's score for a query.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Ranked {
    /// The entry's position in the slice scored.
    pub(super) index: usize,
    /// Its BM25 score; more is better.
    pub(super) score: f64,
    /// The query words whose terms it holds, as the query spells them, in query order.
    pub(super) matched: Vec<String>,
}

fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}'
        | '\u{ac00}'..='\u{d7af}' | '\u{f900}'..='\u{faff}')
}

/// A light English stemmer: enough that the forms people type meet (not a linguist's).
/// `sitting`, `sits` → `sit`; `moving`, `moved`, `moves`, `move` → `mov`.
fn stem(word: &str) -> String {
    let base = strip_suffix(word);
    // A final `e` goes, so that `move` meets `moving` (whose `e` the suffix took).
    match base.strip_suffix('e') {
        Some(rest) if rest.chars().count() >= 3 => rest.to_owned(),
        _ => base,
    }
}

fn strip_suffix(word: &str) -> String {
    let n = word.chars().count();
    let strip = |suffix: &str, min: usize| {
        (n >= min && word.ends_with(suffix)).then(|| word[..word.len() - suffix.len()].to_owned())
    };
    if let Some(base) = strip("ies", 5) {
        return format!("{base}y");
    }
    for (suffix, min) in [("ing", 6), ("ed", 5)] {
        if let Some(base) = strip(suffix, min) {
            return undouble(base);
        }
    }
    if let Some(base) = strip("ly", 6) {
        return base;
    }
    for suffix in ["ches", "shes", "sses", "xes", "zes"] {
        if let Some(base) = strip(suffix, 5) {
            return format!("{base}{}", &suffix[..suffix.len() - 2]);
        }
    }
    if n >= 4 && word.ends_with('s') && !word.ends_with("ss") && !word.ends_with("us") {
        return word[..word.len() - 1].to_owned();
    }
    word.to_owned()
}

/// `sitt` → `sit`, `plann` → `plan` (a consonant doubled before `-ing` or `-ed`); `ll`,
/// `ss` and `zz` stay (`called`, `missed`, `buzzing`).
fn undouble(base: String) -> String {
    let mut chars = base.chars().rev();
    match (chars.next(), chars.next()) {
        (Some(a), Some(b))
            if a == b && a.is_ascii_alphabetic() && !"aeioulsz".contains(a) && base.len() >= 4 =>
        {
            base[..base.len() - 1].to_owned()
        }
        _ => base,
    }
}

/// The terms of `text` (see the module docs).
pub(super) fn terms(text: &str) -> Vec<String> {
    spelled_terms(text)
        .into_iter()
        .map(|(term, _)| term)
        .collect()
}

/// The terms of `text`, each with the word it came from as written (lower case): what a
/// result says it matched.
fn spelled_terms(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let mut latin = String::new();
        let mut cjk: Vec<char> = Vec::new();
        let flush_cjk = |cjk: &mut Vec<char>, out: &mut Vec<(String, String)>| {
            for (i, c) in cjk.iter().enumerate() {
                out.push((c.to_string(), c.to_string()));
                if let Some(next) = cjk.get(i + 1) {
                    let pair = format!("{c}{next}");
                    out.push((pair.clone(), pair));
                }
            }
            cjk.clear();
        };
        let flush_latin = |latin: &mut String, out: &mut Vec<(String, String)>| {
            if !latin.is_empty() {
                let word = std::mem::take(latin);
                out.push((stem(&word), word));
            }
        };
        for c in word.chars() {
            if is_cjk(c) {
                flush_latin(&mut latin, &mut out);
                cjk.push(c);
            } else {
                flush_cjk(&mut cjk, &mut out);
                latin.push(c);
            }
        }
        flush_cjk(&mut cjk, &mut out);
        flush_latin(&mut latin, &mut out);
    }
    out
}

/// Whether the query's word `query` finds `word` of an entry (both as written).
pub(super) fn word_matches(query: &str, word: &str) -> bool {
    matches(&stem(&query.to_lowercase()), &stem(&word.to_lowercase()))
}

/// Whether query term `q` matches entry term `t`.
fn matches(q: &str, t: &str) -> bool {
    q == t || (q.chars().count() >= 4 && t.starts_with(q))
}

/// An inverted index of one chat's entries: for each term, the entries holding it and how
/// often. Built from the store's entries (`cache.rs` keeps it while the chat's stamp holds),
/// so scoring a query reads only the postings of its terms, not every entry.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// Term → (entry, count), entries ascending.
    postings: BTreeMap<String, Vec<(u32, u32)>>,
    /// Each entry's number of terms.
    lengths: Vec<u32>,
    /// Their mean.
    average: f64,
}

impl Index {
    /// The index of `docs` (key, content), in their order.
    pub(super) fn new<'a>(docs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut postings: BTreeMap<String, Vec<(u32, u32)>> = BTreeMap::new();
        let mut lengths = Vec::new();
        for (index, (key, content)) in docs.into_iter().enumerate() {
            let key = terms(key);
            let mut all = key.clone();
            all.extend(key);
            all.extend(terms(content));
            lengths.push(u32::try_from(all.len()).unwrap_or(u32::MAX));
            let mut counts: BTreeMap<String, u32> = BTreeMap::new();
            for term in all {
                *counts.entry(term).or_default() += 1;
            }
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            for (term, count) in counts {
                postings.entry(term).or_default().push((index, count));
            }
        }
        let average = if lengths.is_empty() {
            0.0
        } else {
            lengths.iter().map(|&n| f64::from(n)).sum::<f64>() / lengths.len() as f64
        };
        Index {
            postings,
            lengths,
            average,
        }
    }

    /// How many distinct terms it holds.
    pub(super) fn terms(&self) -> usize {
        self.postings.len()
    }

    /// About how many bytes it takes (terms, postings and lengths).
    pub(super) fn bytes(&self) -> usize {
        self.postings
            .iter()
            .map(|(term, list)| term.len() + 24 + 24 + list.len() * 8)
            .sum::<usize>()
            + self.lengths.len() * 4
    }

    /// The entries holding at least one term of `query`, scored by BM25 (a term's count in
    /// an entry is that of the entry's terms it matches). Best first; ties keep the entries'
    /// order.
    pub(super) fn bm25(&self, query: &str) -> Vec<Ranked> {
        // (term, the query's word for it)
        let mut wanted: Vec<(String, String)> = Vec::new();
        for (term, word) in spelled_terms(query) {
            if !wanted.iter().any(|(t, _)| *t == term) {
                wanted.push((term, word));
            }
        }
        let telling: Vec<(String, String)> = wanted
            .iter()
            .filter(|(t, _)| !STOP_TERMS.contains(t))
            .cloned()
            .collect();
        if !telling.is_empty() {
            wanted = telling;
        }
        let n = self.lengths.len() as f64;
        let mut scores: BTreeMap<u32, (f64, Vec<String>)> = BTreeMap::new();
        for (q, word) in &wanted {
            let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
            for (term, list) in self.postings.range(q.clone()..) {
                if !matches(q, term) {
                    break;
                }
                for &(doc, count) in list {
                    *counts.entry(doc).or_default() += count;
                }
            }
            if counts.is_empty() {
                continue;
            }
            let df = counts.len() as f64;
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for (doc, tf) in counts {
                let length = self
                    .lengths
                    .get(doc as usize)
                    .map_or(0.0, |&l| f64::from(l));
                let norm = K1 * (1.0 - B + B * length / self.average.max(1.0));
                let tf = f64::from(tf);
                let slot = scores.entry(doc).or_default();
                slot.0 += idf * tf * (K1 + 1.0) / (tf + norm);
                slot.1.push(word.clone());
            }
        }
        let mut ranked: Vec<Ranked> = scores
            .into_iter()
            .map(|(doc, (score, matched))| Ranked {
                index: doc as usize,
                score,
                matched,
            })
            .collect();
        // Stable: ties stay in entry order.
        ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
        ranked
    }
}

/// The cosine similarity of two vectors (0 when either is zero or their lengths differ).
pub(super) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut aa, mut bb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        dot / (aa.sqrt() * bb.sqrt())
    }
}

/// Reciprocal rank fusion's constant: a result's weight in a list is `1 / (RRF_K + rank)`;
/// 60 is the value of Cormack et al., which damps the difference between the first few.
const RRF_K: f64 = 60.0;

/// Fuses ranked lists of entry positions (best first) by reciprocal rank fusion: each entry
/// scores the sum over the lists of `1 / (60 + rank)`. Best first; ties go to the entry
/// ranked first in the earlier list.
pub(super) fn fuse(lists: &[Vec<usize>]) -> Vec<(usize, f64)> {
    // Entry → (score, when first seen).
    let mut scores: HashMap<usize, (f64, usize)> = HashMap::new();
    for list in lists {
        for (rank, &doc) in list.iter().enumerate() {
            let weight = 1.0 / (RRF_K + rank as f64 + 1.0);
            let seen = scores.len();
            scores.entry(doc).or_insert((0.0, seen)).0 += weight;
        }
    }
    let mut fused: Vec<(usize, (f64, usize))> = scores.into_iter().collect();
    fused.sort_by(|a, b| b.1.0.total_cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
    fused
        .into_iter()
        .map(|(doc, (score, _))| (doc, score))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_meet_and_chinese_is_split_into_characters_and_pairs() {
        assert_eq!(
            terms("Birthdays booked, booking!"),
            ["birthday", "book", "book"]
        );
        assert_eq!(
            terms("sitting sits moving moves move planned called missed"),
            ["sit", "sit", "mov", "mov", "mov", "plan", "call", "miss"]
        );
        assert_eq!(
            terms("生日快乐"),
            ["生", "生日", "日", "日快", "快", "快乐", "乐"]
        );
        assert_eq!(
            terms("Bob的生日"),
            ["bob", "的", "的生", "生", "生日", "日"]
        );
    }

    #[test]
    fn a_rare_word_outweighs_a_common_one_and_prefixes_find_longer_words() {
        let docs = [
            ("team.lunch", "the team has lunch on friday"),
            ("team.standup", "the team meets at nine"),
            ("bob.birthday", "Bob's birthday is on May 3rd"),
        ];
        let ranked = Index::new(docs).bm25("team birthday");
        assert_eq!(ranked[0].index, 2, "{ranked:?}");
        assert_eq!(ranked[0].matched, ["birthday"]);
        let ranked = Index::new(docs).bm25("birth");
        assert_eq!(ranked.len(), 1);
        let chinese = [("a", "我的生日是五月三日"), ("b", "今天天气很好")];
        let ranked = Index::new(chinese).bm25("你的生日是哪天");
        assert_eq!(ranked[0].index, 0, "{ranked:?}");
        assert!(Index::new(docs).bm25("kubernetes").is_empty());
    }

    #[test]
    fn fusion_rewards_entries_both_lists_rank() {
        let fused = fuse(&[vec![3, 1, 2], vec![1, 4]]);
        let order: Vec<usize> = fused.iter().map(|(doc, _)| *doc).collect();
        assert_eq!(order, [1, 3, 4, 2]);
        assert!(cosine(&[1.0, 0.0], &[2.0, 0.0]) > 0.999);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    }
}
