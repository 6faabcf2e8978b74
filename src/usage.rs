//! The token usage an upstream reports, read off a response body as it streams past: the first
//! and the last few kilobytes are kept (never the whole body), which hold `usage` in every
//! shape: a chat completion's or Messages reply's `usage` object, the final chunk of a stream
//! with `include_usage`, Anthropic's `message_start` (input) and `message_delta` (output),
//! the Responses API's `response.completed`, Gemini's `usageMetadata` (in the last chunk of a
//! stream).

use memchr::memmem;

/// Bytes kept from the start of a body (Anthropic's `message_start` carries the input count).
const HEAD: usize = 4 * 1024;
/// Bytes kept from the end of a body.
const TAIL: usize = 8 * 1024;

/// The keys an input count goes by: OpenAI's, Anthropic's and Google's (whose count includes
/// its cached tokens, as OpenAI's does).
const INPUT_KEYS: [&str; 3] = [
    "\"prompt_tokens\"",
    "\"input_tokens\"",
    "\"promptTokenCount\"",
];
/// The keys an output count goes by, in the same order.
const OUTPUT_KEYS: [&str; 3] = [
    "\"completion_tokens\"",
    "\"output_tokens\"",
    "\"candidatesTokenCount\"",
];

/// Input and output tokens, as the upstream counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input: Option<u64>,
    pub output: Option<u64>,
}

/// What a response body showed of itself so far.
#[derive(Debug, Default)]
pub struct UsageTap {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl UsageTap {
    pub fn observe(&mut self, data: &[u8]) {
        let room = HEAD - self.head.len();
        if room > 0 {
            let take = room.min(data.len());
            self.head.extend_from_slice(&data[..take]);
            if take == data.len() {
                return;
            }
        }
        let rest = &data[room.min(data.len())..];
        if rest.len() >= TAIL {
            self.tail.clear();
            self.tail.extend_from_slice(&rest[rest.len() - TAIL..]);
            return;
        }
        self.tail.extend_from_slice(rest);
        // Trimmed in steps, so a stream of small frames does not move the buffer each time.
        if self.tail.len() > 2 * TAIL {
            self.tail.drain(..self.tail.len() - TAIL);
        }
    }

    /// The usage the body reported, the latest count of each kind winning (a stream repeats
    /// them as they grow).
    pub fn usage(&self) -> Option<Usage> {
        let usage = Usage {
            input: self.last(&INPUT_KEYS),
            output: self.last(&OUTPUT_KEYS),
        };
        (usage.input.is_some() || usage.output.is_some()).then_some(usage)
    }

    /// Every input token the upstream counted for the request: Anthropic reports the tokens
    /// read from or written to its prompt cache apart from `input_tokens`; OpenAI's
    /// `prompt_tokens` and `input_tokens` already include the cached ones.
    pub fn input_total(&self) -> Option<u64> {
        let input = self.last(&INPUT_KEYS)?;
        let cached = [
            "\"cache_creation_input_tokens\"",
            "\"cache_read_input_tokens\"",
        ]
        .iter()
        .filter_map(|key| self.last(&[key]))
        .sum::<u64>();
        Some(input + cached)
    }

    fn last(&self, keys: &[&str]) -> Option<u64> {
        [&self.tail, &self.head]
            .into_iter()
            .find_map(|buffer| {
                keys.iter()
                    .filter_map(|key| last_value(buffer, key))
                    .max_by_key(|(at, _)| *at)
            })
            .map(|(_, value)| value)
    }
}

/// The number after the last `key:` in `buffer`, with where it was found. A key inside a JSON
/// string has escaped quotes, so it never matches.
fn last_value(buffer: &[u8], key: &str) -> Option<(usize, u64)> {
    memmem::rfind_iter(buffer, key.as_bytes()).find_map(|at| {
        let rest = buffer[at + key.len()..].trim_ascii_start();
        let rest = rest.strip_prefix(b":")?.trim_ascii_start();
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&rest[..digits])
            .ok()?
            .parse()
            .ok()
            .map(|value| (at, value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tap(frames: &[&str]) -> Option<Usage> {
        let mut tap = UsageTap::default();
        for frame in frames {
            tap.observe(frame.as_bytes());
        }
        tap.usage()
    }

    fn both(input: u64, output: u64) -> Option<Usage> {
        Some(Usage {
            input: Some(input),
            output: Some(output),
        })
    }

    #[test]
    fn every_shape_of_usage_is_read() {
        let chat = r#"{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":0}}}"#;
        assert_eq!(tap(&[chat]), both(12, 3));
        let padding = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(900)
        );
        let mut stream = vec![padding.as_str(); 40];
        stream.push("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":900,\"completion_tokens\":77}}\n\ndata: [DONE]\n\n");
        assert_eq!(tap(&stream), both(900, 77));
        let messages = [
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":2095,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n",
            &padding.repeat(20),
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":503}}\n\n",
        ];
        assert_eq!(tap(&messages), both(2095, 503));
        let responses = r#"event: response.completed
data: {"type":"response.completed","response":{"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"total_tokens":123}}}"#;
        assert_eq!(tap(&[responses]), both(36, 87));
    }

    #[test]
    fn usage_inside_content_is_not_usage() {
        let echoed = r#"{"choices":[{"message":{"content":"{\"usage\":{\"prompt_tokens\":5}}"}}]}"#;
        assert_eq!(tap(&[echoed]), None);
        assert_eq!(tap(&["not json at all"]), None);
    }

    #[test]
    fn the_input_total_adds_anthropics_cache_counts_and_nothing_to_openais() {
        let mut messages = UsageTap::default();
        messages.observe(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":300,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\n\n");
        assert_eq!(messages.input_total(), Some(2312));
        let mut chat = UsageTap::default();
        chat.observe(br#"{"usage":{"prompt_tokens":900,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":512}}}"#);
        assert_eq!(chat.input_total(), Some(900));
        assert_eq!(UsageTap::default().input_total(), None);
    }
}
