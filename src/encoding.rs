//! The real tokenizers compactor carries, apart from the estimate that falls back on them:
//! configuration checks that a named `tokenizer.json` loads, the planner counts with it.

/// A real tokenizer compactor carries: OpenAI's encodings (the `bpe-openai` crate, built once
/// per process on first use), or a Hugging Face `tokenizer.json` a `models` entry names (loaded
/// once per path and kept for the process, so reloads do not load it again).
#[derive(Clone, Copy)]
pub enum Encoding {
    O200k,
    Cl100k,
    #[cfg(feature = "hf-tokenizers")]
    File(&'static tokenizers::Tokenizer),
}

impl PartialEq for Encoding {
    fn eq(&self, other: &Encoding) -> bool {
        match (self, other) {
            (Encoding::O200k, Encoding::O200k) | (Encoding::Cl100k, Encoding::Cl100k) => true,
            #[cfg(feature = "hf-tokenizers")]
            (Encoding::File(a), Encoding::File(b)) => std::ptr::eq(*a, *b),
            _ => false,
        }
    }
}

impl std::fmt::Debug for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoding::O200k => "O200k",
            Encoding::Cl100k => "Cl100k",
            #[cfg(feature = "hf-tokenizers")]
            Encoding::File(_) => "File",
        })
    }
}

/// A 64-bit hash of a text (with its length, the cache's key: a collision would need both).
fn text_hash(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Every `tokenizer.json` loaded, by path: one copy per process whatever the reloads.
#[cfg(feature = "hf-tokenizers")]
static LOADED: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, &'static tokenizers::Tokenizer>>,
> = std::sync::LazyLock::new(Default::default);

/// Texts shorter than this are counted every time: cheaper than a lookup.
const CACHED_FROM_BYTES: usize = 32;
/// Counts kept: a conversation's messages, over the turns of a few hundred conversations.
const CACHED_COUNTS: usize = 65_536;

/// The counts of texts already counted, by encoding and a hash of the text. A conversation is
/// sent whole on every turn and a body near a trigger is counted exactly, so without it each
/// turn pays the tokenizer for every earlier message again (most of the reuse path's time at
/// 1 MB); with it, for the new messages only.
static COUNTED: std::sync::LazyLock<quick_cache::sync::Cache<(usize, u64, usize), u64>> =
    std::sync::LazyLock::new(|| quick_cache::sync::Cache::new(CACHED_COUNTS));

impl Encoding {
    /// The text's tokens, from the cache of texts counted before when it is long enough.
    pub fn count(self, text: &str) -> u64 {
        if text.len() < CACHED_FROM_BYTES {
            return self.count_now(text);
        }
        let key = (self.id(), text_hash(text), text.len());
        if let Some(tokens) = COUNTED.get(&key) {
            return tokens;
        }
        let tokens = self.count_now(text);
        COUNTED.insert(key, tokens);
        tokens
    }

    /// Which encoding it is, for the cache's key: a `tokenizer.json` by its (leaked, lasting)
    /// address.
    fn id(self) -> usize {
        match self {
            Encoding::O200k => 0,
            Encoding::Cl100k => 1,
            #[cfg(feature = "hf-tokenizers")]
            Encoding::File(tokenizer) => std::ptr::from_ref(tokenizer) as usize,
        }
    }

    fn count_now(self, text: &str) -> u64 {
        let tokenizer = match self {
            Encoding::O200k => bpe_openai::o200k_base(),
            Encoding::Cl100k => bpe_openai::cl100k_base(),
            #[cfg(feature = "hf-tokenizers")]
            Encoding::File(tokenizer) => {
                // Special tokens are the template's, which the per-message overhead stands for.
                return tokenizer
                    .encode_fast(text, false)
                    .map_or(0, |encoding| encoding.len() as u64);
            }
        };
        tokenizer.count(text) as u64
    }

    /// The tokenizer in a Hugging Face `tokenizer.json`, loaded once per path.
    #[cfg(feature = "hf-tokenizers")]
    pub fn from_file(path: &str) -> Result<Encoding, String> {
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tokenizer) = loaded.get(path) {
            return Ok(Encoding::File(tokenizer));
        }
        let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|e| e.to_string())?;
        let tokenizer: &'static tokenizers::Tokenizer = Box::leak(Box::new(tokenizer));
        loaded.insert(path.to_string(), tokenizer);
        Ok(Encoding::File(tokenizer))
    }

    /// A build without the `hf-tokenizers` feature reads no `tokenizer.json`.
    #[cfg(not(feature = "hf-tokenizers"))]
    pub fn from_file(_path: &str) -> Result<Encoding, String> {
        Err("this compactor was built without the hf-tokenizers feature".into())
    }

    /// OpenAI's encoding for one of its model names.
    pub fn for_model(model: &str) -> Option<Encoding> {
        const O200K: [&str; 9] = [
            "gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss", "chatgpt-", "codex-", "o1", "o3",
        ];
        if O200K.iter().any(|prefix| model.starts_with(prefix)) || model.starts_with("o4") {
            return Some(Encoding::O200k);
        }
        ["gpt-4", "gpt-3.5"]
            .iter()
            .any(|prefix| model.starts_with(prefix))
            .then_some(Encoding::Cl100k)
    }
}

#[cfg(all(test, not(feature = "hf-tokenizers")))]
mod tests {
    #[test]
    fn without_the_feature_a_tokenizer_file_is_refused_with_why() {
        let refused = super::Encoding::from_file("tokenizer.json").unwrap_err();
        assert!(refused.contains("hf-tokenizers"), "{refused}");
    }
}

#[cfg(test)]
mod cache_tests {
    use super::Encoding;

    #[test]
    fn a_cached_count_is_the_tokenizers_own_for_each_encoding() {
        let text = "fn step() { run(); } // the parser drops a token\n".repeat(40);
        for _ in 0..2 {
            for encoding in [Encoding::O200k, Encoding::Cl100k] {
                assert_eq!(encoding.count(&text), encoding.count_now(&text));
            }
        }
        // The same text under two encodings is two entries, not one.
        let cjk = "读取文件并修复错误。".repeat(40);
        assert_ne!(Encoding::O200k.count(&cjk), Encoding::Cl100k.count(&cjk));
        assert_eq!(
            Encoding::Cl100k.count(&cjk),
            Encoding::Cl100k.count_now(&cjk)
        );
    }
}
