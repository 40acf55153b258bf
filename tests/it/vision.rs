//! Images against the real binary: decompression bombs sent by members of several chats at
//! once stay within a memory ceiling, and a vision model on another endpoint never gets the
//! main API key. The daemon runs against FakeTelegram and FakeLlm on 127.0.0.1.

use std::time::Duration;

use parlor_bot::testing::PNG_1X1;
use parlor_testkit::{DaemonProcess, FakeLlm, FakeTelegram, Reply};

use crate::support::{self, TOKEN, bob, config, daemon_command};

/// Decoding 40 megapixels in a debug build takes seconds, one image after another.
const WAIT: Duration = Duration::from_secs(240);

/// A PNG of `width` × `height` black RGB pixels, written by hand so that the test does not
/// spend seconds (and the pixels' memory) encoding it: every byte of the image data is
/// zero (filter 0, black), which deflate writes as one literal and then matches of 258
/// bytes at distance 1. 40 megapixels come to about 700 KiB: a decompression bomb.
fn black_png(width: u32, height: u32) -> Vec<u8> {
    let raw = u64::from(height) * (1 + 3 * u64::from(width));
    let mut bits = Bits::default();
    bits.push(1, 1); // the final block
    bits.push(1, 2); // fixed Huffman codes
    let literal_zero = || (0x30u32, 8); // literal 0: 0x30 + 0, 8 bits
    let mut left = raw;
    bits.push_code(literal_zero());
    left -= 1;
    while left >= 258 {
        bits.push_code((0xC5, 8)); // length 258: symbol 285
        bits.push_code((0, 5)); // distance 1: code 0
        left -= 258;
    }
    for _ in 0..left {
        bits.push_code(literal_zero());
    }
    bits.push_code((0, 7)); // end of block: symbol 256
    let mut zlib = vec![0x78, 0x01];
    zlib.extend(bits.finish());
    // Adler-32 of `raw` zero bytes: a stays 1, b adds 1 per byte.
    let adler = ((raw % 65_521) << 16) | 1;
    zlib.extend_from_slice(&u32::try_from(adler).unwrap().to_be_bytes());

    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &zlib);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// A deflate bit stream: values LSB first, Huffman codes MSB first.
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn push(&mut self, value: u32, count: u32) {
        self.acc |= u64::from(value) << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }

    fn push_code(&mut self, (code, len): (u32, u32)) {
        let reversed = code.reverse_bits() >> (32 - len.max(1));
        self.push(if len == 0 { 0 } else { reversed }, len);
    }

    fn finish(mut self) -> Vec<u8> {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
        self.out
    }
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
    let mut crc_input = kind.to_vec();
    crc_input.extend_from_slice(data);
    png.extend_from_slice(&crc_input);
    png.extend_from_slice(&crc32(&crc_input).to_be_bytes());
}

fn crc32(data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|mut c| {
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            c
        })
        .collect();
    !data.iter().fold(0xFFFF_FFFFu32, |crc, &b| {
        table[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
    })
}

/// The most memory the process has held at once (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    let kib: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// The text of every message of a recorded request, as JSON.
fn messages_text(request: &parlor_testkit::RecordedRequest) -> String {
    serde_json::Value::Array(request.messages().to_vec()).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_chats_sending_40_megapixel_pngs_at_once_stay_under_256_mib() {
    const GROUPS: [i64; 4] = [-100_201, -100_202, -100_203, -100_204];
    const HUGE_GROUP: i64 = -100_205;
    let bomb = black_png(8000, 5000);
    assert!(bomb.len() < 1024 * 1024, "{} bytes", bomb.len());
    // 100 megapixels: only the header and the start of the data; were it decoded, the
    // answer would be a broken image, not a refusal.
    let huge = {
        let mut png = black_png(1, 1);
        png[16..24].copy_from_slice(&[0, 0, 0x27, 0x10, 0, 0, 0x27, 0x10]);
        let ihdr_crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&ihdr_crc.to_be_bytes());
        png
    };

    let llm = FakeLlm::start().await;
    llm.respond_with(|_| Reply::text("A black picture."));
    let telegram = FakeTelegram::start(TOKEN).await;
    for i in 0..GROUPS.len() {
        telegram.add_file(&format!("bomb-{i}"), bomb.clone());
    }
    telegram.add_file("huge", huge.clone());
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &telegram, "");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[llm]\n", "[llm]\nvision = true\n")).unwrap();
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&path, &llm), &telegram, WAIT).await;
    let pid = daemon.child.id().unwrap();

    for (i, group) in GROUPS.iter().enumerate() {
        telegram
            .group_message(*group, bob(), "@parlor_bot what is on this picture?")
            .mention_bot()
            .photo(format!("bomb-{i}"), bomb.len() as u64)
            .push();
    }
    telegram
        .group_message(HUGE_GROUP, bob(), "@parlor_bot and this one?")
        .mention_bot()
        .photo("huge", huge.len() as u64)
        .push();
    let sent = telegram.wait_for_sent(5, WAIT).await.unwrap_or_else(|e| {
        panic!("{e}\n{}", daemon.log());
    });
    assert!(
        sent.iter().all(|m| m.text == "A black picture."),
        "{sent:?}"
    );

    let peak = peak_rss(pid);
    eprintln!("peak RSS: {} MiB", peak / (1024 * 1024));
    assert!(
        peak < 256 * 1024 * 1024,
        "peak RSS {} MiB",
        peak / (1024 * 1024)
    );

    // Every 40-megapixel picture reached the model, scaled down; the 100-megapixel one as
    // a refusal the model can read.
    let requests = llm.requests();
    let shown = requests
        .iter()
        .filter(|r| messages_text(r).contains("data:image/jpeg;base64,"))
        .count();
    assert_eq!(shown, GROUPS.len(), "{} requests", requests.len());
    let refusal = requests
        .iter()
        .map(messages_text)
        .find(|m| m.contains("could not be shown"))
        .unwrap_or_else(|| panic!("no refusal reached the model\n{}", daemon.log()));
    assert!(
        refusal.contains("too large") && refusal.contains("100 megapixels"),
        "{refusal}"
    );

    daemon.terminate(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vision_model_on_another_endpoint_never_gets_the_main_key() {
    let llm = FakeLlm::start().await;
    let eyes = FakeLlm::start().await;
    let telegram = FakeTelegram::start(TOKEN).await;
    telegram.add_file("photo-1", PNG_1X1.to_vec());
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &telegram, "");
    support::add_vision_model(&path, &eyes.base_url());
    let mut daemon =
        DaemonProcess::spawn_polling(daemon_command(&path, &llm), &telegram, WAIT).await;
    eyes.push(Reply::text("A single grey pixel.").usage(300, 20));
    llm.push(Reply::text("It is one grey pixel."));
    telegram
        .group_message(-100_123, bob(), "@parlor_bot what is on our picture?")
        .mention_bot()
        .photo("photo-1", PNG_1X1.len() as u64)
        .push();
    telegram.wait_for_sent(1, WAIT).await.unwrap();
    let asked = eyes.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].authorization(), None);
    assert_eq!(llm.requests()[0].authorization(), Some("Bearer sk-test"));

    // The description's tokens are the turn's: 300 + 20 from the vision model, 10 + 5 (the
    // fake's default) from the main one.
    telegram.group_message(-100_123, bob(), "/status").push();
    let sent = telegram.wait_for_sent(2, WAIT).await.unwrap();
    assert!(
        sent[1].text.contains("Tokens today (UTC): 335 ("),
        "{}",
        sent[1].text
    );
    daemon.terminate(WAIT).await;
}
