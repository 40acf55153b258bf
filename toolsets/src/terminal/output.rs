//! Bounded capture of command output and the text helpers of the toolset: the head and tail
//! of an output (with how much was cut), XML escaping, and the tail of a log file.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use parlor_bot::text::{last_chars, split_chars};

/// Output of a running command, in bounded memory: the first `cap` bytes, and a window of
/// the last `cap` bytes; what falls between is counted, not kept.
#[derive(Debug)]
pub(crate) struct CappedBuf {
    cap: usize,
    head: Vec<u8>,
    tail: Vec<u8>,
    dropped_chars: usize,
    dropped_bytes: usize,
}

impl CappedBuf {
    pub(crate) fn new(cap: usize) -> Self {
        CappedBuf {
            cap: cap.max(256),
            head: Vec::new(),
            tail: Vec::new(),
            dropped_chars: 0,
            dropped_bytes: 0,
        }
    }

    pub(crate) fn push(&mut self, mut bytes: &[u8]) {
        if self.head.len() < self.cap {
            let take = (self.cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * self.cap {
            let drop = self.tail.len() - self.cap;
            self.dropped_chars += count_chars(&self.tail[..drop]);
            self.dropped_bytes += drop;
            self.tail.drain(..drop);
        }
    }

    /// The last `n` bytes seen (fewer when fewer were kept).
    pub(crate) fn last_bytes(&self, n: usize) -> Vec<u8> {
        if self.tail.len() >= n || self.dropped_bytes > 0 {
            let start = self.tail.len().saturating_sub(n);
            return self.tail[start..].to_vec();
        }
        let from_head = n - self.tail.len();
        let start = self.head.len().saturating_sub(from_head);
        let mut out = self.head[start..].to_vec();
        out.extend_from_slice(&self.tail);
        out
    }

    /// Removes the last `n` bytes (the sentinel line).
    pub(crate) fn truncate_end(&mut self, mut n: usize) {
        let from_tail = n.min(self.tail.len());
        self.tail.truncate(self.tail.len() - from_tail);
        n -= from_tail;
        let from_head = n.min(self.head.len());
        self.head.truncate(self.head.len() - from_head);
    }

    /// The output as text, at most `max_chars` characters: its head and tail around a
    /// `[... N characters cut ...]` line.
    pub(crate) fn finish(&self, max_chars: usize) -> Capped {
        let head = String::from_utf8_lossy(&self.head);
        let tail = String::from_utf8_lossy(&self.tail);
        if self.dropped_bytes == 0 {
            let mut all = head.into_owned();
            all.push_str(&tail);
            return cap_middle(&all, max_chars);
        }
        let half = max_chars / 2;
        let head_chars = head.chars().count();
        let tail_chars = tail.chars().count();
        let total = head_chars + tail_chars + self.dropped_chars;
        let kept_head = split_chars(&head, half).0;
        let kept_tail = last_chars(&tail, half);
        let cut = total - kept_head.chars().count() - kept_tail.chars().count();
        Capped {
            text: join_cut(kept_head, cut, kept_tail),
            total_chars: total,
            cut_chars: cut,
        }
    }
}

/// A capped text and how much of it was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Capped {
    pub text: String,
    pub total_chars: usize,
    pub cut_chars: usize,
}

fn count_chars(bytes: &[u8]) -> usize {
    // Every UTF-8 character has exactly one byte that is not a continuation byte.
    bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count()
}

fn join_cut(head: &str, cut: usize, tail: &str) -> String {
    format!("{head}\n[... {cut} characters cut ...]\n{tail}")
}

/// `text` if it has at most `max_chars` characters; otherwise its first and last
/// `max_chars / 2` characters around a line saying how many were cut.
pub(crate) fn cap_middle(text: &str, max_chars: usize) -> Capped {
    let total = text.chars().count();
    if total <= max_chars {
        return Capped {
            text: text.to_owned(),
            total_chars: total,
            cut_chars: 0,
        };
    }
    let half = max_chars / 2;
    let head = split_chars(text, half).0;
    let tail = last_chars(text, half);
    let cut = total - 2 * half;
    Capped {
        text: join_cut(head, cut, tail),
        total_chars: total,
        cut_chars: cut,
    }
}

/// The last `max_chars` characters of `text`, and how many came before them.
pub(crate) fn tail_chars(text: &str, max_chars: usize) -> (String, usize) {
    let total = text.chars().count();
    if total <= max_chars {
        return (text.to_owned(), 0);
    }
    (last_chars(text, max_chars).to_owned(), total - max_chars)
}

pub use crate::notice::xml_escape;

/// The end of a log file: at most `max_bytes` bytes, decoded leniently, and the file's size.
/// A missing file reads as empty.
pub(crate) fn read_log_tail(path: &Path, max_bytes: u64) -> std::io::Result<(String, u64)> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), 0)),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    let start = size.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(max_bytes).read_to_end(&mut bytes)?;
    // A cut in the middle of a character: skip its continuation bytes.
    let skip = if start > 0 {
        bytes.iter().take_while(|&&b| b & 0xC0 == 0x80).count()
    } else {
        0
    };
    Ok((String::from_utf8_lossy(&bytes[skip..]).into_owned(), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_buf_keeps_head_and_tail_and_counts_the_middle() {
        let mut buf = CappedBuf::new(256);
        for i in 0..1000 {
            buf.push(format!("{i:04}\n").as_bytes());
        }
        let capped = buf.finish(100);
        assert_eq!(capped.total_chars, 5000);
        assert!(capped.text.starts_with("0000\n"));
        assert!(capped.text.ends_with("0999\n"));
        assert_eq!(capped.cut_chars, 4900);
    }

    #[test]
    fn small_output_is_whole_and_sentinel_trim_works() {
        let mut buf = CappedBuf::new(256);
        buf.push(b"hello\n__END_0\n");
        assert_eq!(buf.last_bytes(8), b"__END_0\n");
        buf.truncate_end(8);
        let capped = buf.finish(100);
        assert_eq!(capped.text, "hello\n");
        assert_eq!(capped.cut_chars, 0);
    }

    #[test]
    fn escapes_xml() {
        assert_eq!(xml_escape("a<b & 'c'"), "a&lt;b &amp; &apos;c&apos;");
    }
}
