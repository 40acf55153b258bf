//! BM25 over a chat's memory entries, computed at query time from the store (the store is
//! the truth, so there is no index to go stale or rebuild; a chat holds at most
//! `max_entries`, 200 by default, which this scores in well under a millisecond).
//!
//! Terms: lower-case words split at anything that is not a letter or digit, lightly
//! stemmed (`birthdays`, `booked`, `booking` → `birthday`, `book`, `book`), and CJK text, which
//! has no spaces, as single characters and overlapping pairs (`生日快乐` → `生`, `日`, `快`,
//! `乐`, `生日`, `日快`, `快乐`). A query term of four or more characters also matches terms
//! it begins (`birth` finds `birthday`). The key's terms count twice: a key names its topic.

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
    /// The query terms it holds, in query order.
    pub(super) matched: Vec<String>,
}

fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{3040}'..='\u{30ff}' | '\u{3400}'..='\u{4dbf}' | '\u{4e00}'..='\u{9fff}'
        | '\u{ac00}'..='\u{d7af}' | '\u{f900}'..='\u{faff}')
}

/// A light English stemmer: enough that the forms people type meet (not a linguist's).
fn stem(word: &str) -> String {
    let n = word.chars().count();
    let strip = |suffix: &str, min: usize| {
        (n >= min && word.ends_with(suffix)).then(|| word[..word.len() - suffix.len()].to_owned())
    };
    if let Some(base) = strip("ies", 5) {
        return format!("{base}y");
    }
    for (suffix, min) in [("ing", 6), ("ed", 5), ("ly", 6)] {
        if let Some(base) = strip(suffix, min) {
            return base;
        }
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

/// The terms of `text` (see the module docs).
pub(super) fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let mut latin = String::new();
        let mut cjk: Vec<char> = Vec::new();
        let flush_cjk = |cjk: &mut Vec<char>, out: &mut Vec<String>| {
            for (i, c) in cjk.iter().enumerate() {
                out.push(c.to_string());
                if let Some(next) = cjk.get(i + 1) {
                    out.push(format!("{c}{next}"));
                }
            }
            cjk.clear();
        };
        for c in word.chars() {
            if is_cjk(c) {
                if !latin.is_empty() {
                    out.push(stem(&std::mem::take(&mut latin)));
                }
                cjk.push(c);
            } else {
                flush_cjk(&mut cjk, &mut out);
                latin.push(c);
            }
        }
        flush_cjk(&mut cjk, &mut out);
        if !latin.is_empty() {
            out.push(stem(&latin));
        }
    }
    out
}

/// Whether query term `q` matches entry term `t`.
fn matches(q: &str, t: &str) -> bool {
    q == t || (q.chars().count() >= 4 && t.starts_with(q))
}

/// Scores `docs` (key, content) for `query`; entries holding no query term are left out.
/// Best first; ties keep the order of `docs`.
pub(super) fn bm25(query: &str, docs: &[(&str, &str)]) -> Vec<Ranked> {
    let mut wanted: Vec<String> = Vec::new();
    for term in terms(query) {
        if !wanted.contains(&term) {
            wanted.push(term);
        }
    }
    if wanted.is_empty() || docs.is_empty() {
        return Vec::new();
    }
    let doc_terms: Vec<Vec<String>> = docs
        .iter()
        .map(|(key, content)| {
            let key = terms(key);
            let mut all = key.clone();
            all.extend(key);
            all.extend(terms(content));
            all
        })
        .collect();
    let n = doc_terms.len() as f64;
    let average = doc_terms.iter().map(Vec::len).sum::<usize>() as f64 / n;
    let counts: Vec<Vec<usize>> = doc_terms
        .iter()
        .map(|terms| {
            wanted
                .iter()
                .map(|q| terms.iter().filter(|t| matches(q, t)).count())
                .collect()
        })
        .collect();
    let idf: Vec<f64> = (0..wanted.len())
        .map(|i| {
            let df = counts.iter().filter(|c| c[i] > 0).count() as f64;
            (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    let mut ranked: Vec<Ranked> = counts
        .iter()
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&tf| tf > 0))
        .map(|(index, c)| {
            let length = doc_terms[index].len() as f64;
            let norm = K1 * (1.0 - B + B * length / average.max(1.0));
            let score = c
                .iter()
                .zip(&idf)
                .map(|(&tf, idf)| {
                    let tf = tf as f64;
                    idf * tf * (K1 + 1.0) / (tf + norm)
                })
                .sum();
            let matched = wanted
                .iter()
                .zip(c)
                .filter(|(_, tf)| **tf > 0)
                .map(|(q, _)| q.clone())
                .collect();
            Ranked {
                index,
                score,
                matched,
            }
        })
        .collect();
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score));
    ranked
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
        let ranked = bm25("team birthday", &docs);
        assert_eq!(ranked[0].index, 2, "{ranked:?}");
        assert_eq!(ranked[0].matched, ["birthday"]);
        let ranked = bm25("birth", &docs);
        assert_eq!(ranked.len(), 1);
        let chinese = [("a", "我的生日是五月三日"), ("b", "今天天气很好")];
        let ranked = bm25("你的生日是哪天", &chinese);
        assert_eq!(ranked[0].index, 0, "{ranked:?}");
        assert!(bm25("kubernetes", &docs).is_empty());
    }
}
