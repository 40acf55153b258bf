//! The cap on an image download: refused before downloading when the size is known, cut
//! off while streaming when it is not (or when the server's size was wrong).

use futures::{Stream, StreamExt};
use parlor_bot::platform::PlatformError;

use super::Failure;

/// The most bytes one image download may bring.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SizeLimit(pub u64);

impl SizeLimit {
    /// The refusal of an image of `size` bytes, or more when the download was cut off.
    pub(crate) fn exceeded(self, size: u64) -> PlatformError {
        PlatformError::Refused(format!(
            "the image has {size} bytes or more; the limit is {} bytes",
            self.0
        ))
    }

    /// Refuses a size known before downloading that is over the limit.
    pub(crate) fn check(self, size: Option<u64>) -> Result<(), PlatformError> {
        match size {
            Some(size) if size > self.0 => Err(self.exceeded(size)),
            _ => Ok(()),
        }
    }

    /// Reads `stream` to its end, and fails as soon as it brought more than the limit;
    /// `expected` (the size announced, 0 when unknown) only sizes the buffer. A chunk's
    /// error becomes what `failure` makes of it.
    pub(crate) async fn read<S, C, E>(
        self,
        stream: S,
        expected: u64,
        failure: impl Fn(E) -> Failure,
    ) -> Result<Vec<u8>, Failure>
    where
        S: Stream<Item = Result<C, E>>,
        C: AsRef<[u8]>,
    {
        let mut stream = std::pin::pin!(stream);
        let mut bytes = Vec::with_capacity(usize::try_from(expected.min(self.0)).unwrap_or(0));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(&failure)?;
            let chunk = chunk.as_ref();
            let total = bytes.len() as u64 + chunk.len() as u64;
            if total > self.0 {
                return Err(Failure::Fatal(self.exceeded(total)));
            }
            bytes.extend_from_slice(chunk);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(sizes: &[usize]) -> impl Stream<Item = Result<Vec<u8>, String>> {
        futures::stream::iter(sizes.iter().map(|&n| Ok(vec![7u8; n])).collect::<Vec<_>>())
    }

    #[tokio::test]
    async fn a_download_is_cut_off_past_the_limit() {
        let limit = SizeLimit(10);
        let read = limit.read(chunks(&[4, 6]), 0, Failure::Transient).await;
        assert_eq!(read.expect("exactly the limit").len(), 10);
        let read = limit.read(chunks(&[4, 6, 1]), 0, Failure::Transient).await;
        assert!(
            matches!(read, Err(Failure::Fatal(PlatformError::Refused(ref m))) if m.contains("11 bytes")),
            "{read:?}"
        );
        assert!(limit.check(Some(11)).is_err());
        assert!(limit.check(Some(10)).is_ok() && limit.check(None).is_ok());
    }

    #[tokio::test]
    async fn a_chunk_error_is_what_the_caller_makes_of_it() {
        let stream = futures::stream::iter(vec![Ok(vec![1u8]), Err("reset".to_owned())]);
        let read = SizeLimit(10).read(stream, 1, Failure::Transient).await;
        assert!(matches!(read, Err(Failure::Transient(ref m)) if m == "reset"));
    }
}
