//! The compaction eval's pipeline tier (issue 27, 41): no model, deterministic. Generated agent
//! runs (English prose, code, CJK) carry planted facts of four kinds (an exact error string, an
//! artifact with its path, a decision, the next step) in the part of the run a compaction
//! evicts. For each strategy, each fact ends either kept verbatim in the messages forwarded, in
//! the forwarded summary, only shown to the summarizer (it may or may not survive in a real
//! model's summary: the model tier asks), or lost outright. compactor's strategies run through
//! the real engine with a summarizer that records its prompts and answers one constant line, so
//! whatever reaches the forwarded summary is compactor's own doing (its identifier index): with
//! the index off, nothing does (the negative control). The references' policies (LangChain's
//! `trim_tokens_to_summarize: 4000`, naive truncation) are computed from the same messages.
//! `scripts/eval.sh` prints the table; the test holds compactor to it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::common::Rng;
use bytes::Bytes;
use compactor::apis::Api;
use compactor::compaction::engine::CompactionEngine;
use compactor::compaction::scope::Caller;
use compactor::compaction::summaries::summarizer::{
    Summarizer, Summary, SummaryFuture, SummaryRequest,
};
use compactor::config::Config;
use http::HeaderMap;
use serde_json::{json, Value};

const RUNS_PER_LANGUAGE: u64 = 20;

/// The size of a generated run: its tool steps and the words of each thought and output.
#[derive(Clone, Copy)]
struct Scale {
    steps: usize,
    thought_words: usize,
    output_words: usize,
}

/// The pipeline tier's runs: a compaction evicts 15 000 to 20 000 estimated tokens of each.
const PIPELINE: Scale = Scale {
    steps: 40,
    thought_words: 40,
    output_words: 260,
};

/// The model tier's runs (`scripts/eval-model.sh`): the same generator, small enough that the
/// whole history fits a packaged small model's 8 192-token window, so the answer from full
/// history can be asked for too.
const MODEL_TIER: Scale = Scale {
    steps: 12,
    thought_words: 20,
    output_words: 45,
};
const KINDS: [&str; 4] = ["exact fact", "artifact", "decision", "next step"];
const LANGUAGES: [&str; 3] = ["English", "code", "CJK"];
const STRATEGIES: [&str; 6] = [
    "compactor: summary (fold)",
    "compactor: summary (fold), no identifier index",
    "compactor: clear tool outputs only",
    "compactor: truncate",
    "LangChain: trim_tokens_to_summarize 4000",
    "naive truncation",
];

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Fate {
    Kept,
    InSummary,
    Shown,
    Lost,
}

/// Counts per fate, in [`Fate`]'s order.
type Fates = [u32; 4];

/// One planted fact: its kind and the token that identifies it wherever it ends up.
struct Planted {
    kind: &'static str,
    marker: String,
}

struct Run {
    messages: Vec<Value>,
    planted: Vec<Planted>,
}

fn filler(language: &str, rng: &mut Rng, words: usize) -> String {
    const EN: [&str; 12] = [
        "the",
        "service",
        "reads",
        "each",
        "request",
        "and",
        "then",
        "checks",
        "its",
        "cache",
        "before",
        "answering",
    ];
    const CODE: [&str; 8] = [
        "let x = parse(input)?;",
        "if x.len() > limit { return Err(TooLarge); }",
        "for item in items.iter() {",
        "    total += item.weight;",
        "}",
        "fn handle(req: Request) -> Response {",
        "match state { Ready => go(), _ => wait() }",
        "// retry with backoff",
    ];
    const CJK: [&str; 10] = [
        "服务", "读取", "每个", "请求", "然后", "检查", "缓存", "之前", "回答", "配置",
    ];
    let mut out = String::new();
    // A line of code is about six words of prose: the three languages weigh about the same.
    let words = if language == "code" { words / 6 } else { words };
    for i in 0..words {
        let pick = rng.next() as usize;
        match language {
            "code" => {
                out.push_str(CODE[pick % CODE.len()]);
                out.push('\n');
            }
            "CJK" => out.push_str(CJK[pick % CJK.len()]),
            _ => {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(EN[pick % EN.len()]);
            }
        }
    }
    out
}

/// An agent run of `scale.steps` tool steps with one fact of each kind planted in its first
/// two fifths (what a compaction evicts), and the next step just after its middle.
fn agent_run(language: &'static str, seed: u64, scale: Scale) -> Run {
    let mut rng = Rng(seed * 7919 + 17);
    let mut planted = Vec::new();
    let mut at = BTreeMap::new();
    // Placements in fortieths of the run.
    for (kind, (low, high)) in KINDS.iter().zip([(2, 16), (2, 16), (1, 16), (18, 26)]) {
        let low = low * scale.steps / 40;
        let high = (high * scale.steps / 40).max(low + 1);
        let step = low + (rng.next() as usize) % (high - low);
        let marker = format!("Q{}{seed}{}Z", &kind[..2].to_uppercase(), language.len());
        at.entry(step)
            .or_insert_with(Vec::new)
            .push((*kind, marker.clone()));
        planted.push(Planted { kind, marker });
    }
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent with tools."}),
        json!({"role": "user", "content": format!("Fix the failing service. {}", filler(language, &mut rng, 30))}),
    ];
    for step in 0..scale.steps {
        let mut thought = filler(language, &mut rng, scale.thought_words);
        let mut output = filler(language, &mut rng, scale.output_words);
        for (kind, marker) in at.get(&step).into_iter().flatten() {
            match *kind {
                "exact fact" => output.push_str(&format!(
                    "\nerror[{marker}]: connection refused on port {}",
                    5000 + seed
                )),
                "artifact" => thought.push_str(&format!(
                    " I changed src/retry_{marker}.rs: added fn backoff."
                )),
                "decision" => thought.push_str(&format!(
                    " Decision {marker}: use exponential backoff instead of polling."
                )),
                _ => thought.push_str(&format!(
                    " Next step {marker}: run the migration after the tests pass."
                )),
            }
        }
        let id = format!("call_{seed}_{step}");
        messages.push(json!({"role": "assistant", "content": thought, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/m{step}.rs\"}}")}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
    }
    messages.push(json!({"role": "user", "content": "Continue."}));
    Run { messages, planted }
}

/// Answers every call with one short line and keeps the prompts it was shown.
#[derive(Default)]
struct Recording {
    prompts: Mutex<Vec<String>>,
}

impl Summarizer for Recording {
    fn summarize(&self, request: SummaryRequest) -> SummaryFuture {
        if let Ok(mut prompts) = self.prompts.lock() {
            prompts.push(request.prompt);
        }
        Box::pin(async {
            Ok(Summary::from(
                "The agent is fixing the service.".to_string(),
            ))
        })
    }
}

const TRIGGER: u64 = 12_000;
const WINDOW: u64 = 16_000;

fn engine(stages: &str, extra: &str) -> (CompactionEngine, Arc<Recording>) {
    let yaml = format!(
        "upstreams:\n  - name: mock\n    base_url: http://127.0.0.1:9/v1\nmodels:\n  - match: \"eval-*\"\n    max_input_tokens: {WINDOW}\nsummarization:\n  enabled: true\n  trigger: [{{type: tokens, value: {TRIGGER}}}]\n  keep: {{type: messages, value: 20}}\n  stages: {stages}\n  max_calls_per_minute_per_tenant: 100000\n{extra}"
    );
    let config = Config::from_yaml(&yaml).expect("eval config");
    let recording = Arc::new(Recording::default());
    (
        CompactionEngine::with_summarizer(&config, recording.clone()),
        recording,
    )
}

/// What a strategy forwarded (the messages kept, the summary) and showed its summarizer.
struct Seen {
    kept: String,
    summary: String,
    shown: String,
}

async fn through_engine(engine: &CompactionEngine, recording: &Recording, run: &Run) -> Seen {
    let body = json!({"model": "eval-model", "messages": run.messages}).to_string();
    let forwarded = match engine
        .compact(
            &HeaderMap::new(),
            Bytes::from(body),
            "mock",
            Caller::default(),
            &Api::ChatCompletions.body_request(),
        )
        .await
    {
        Ok(compacted) => serde_json::from_slice::<Value>(&compacted.body).unwrap_or_default(),
        Err(_) => panic!("fail_mode open never refuses"),
    };
    let (mut kept, mut summary) = (Vec::new(), String::new());
    for message in forwarded["messages"].as_array().into_iter().flatten() {
        match message["content"]
            .as_str()
            .and_then(|text| text.strip_prefix("Here is a summary of the conversation to date:"))
        {
            Some(text) => summary.push_str(text),
            None => kept.push(message.to_string()),
        }
    }
    let shown = recording
        .prompts
        .lock()
        .map(|mut prompts| std::mem::take(&mut *prompts).join("\n"))
        .unwrap_or_default();
    Seen {
        kept: kept.join("\n"),
        summary,
        shown,
    }
}

/// compactor's count of a message, as the references would count with a plain 4-chars counter.
fn approx_tokens(message: &Value) -> u64 {
    (message.to_string().chars().count() as u64).div_ceil(4)
}

/// The layout the reference keeps (the last 20 messages, start moved back to a tool call's
/// assistant) and what LangChain's summarizer sees of the rest: `trim_messages(strategy="last",
/// max_tokens=4000, start_on="human")`, so the most recent 4 000 tokens starting on a user turn.
fn langchain(run: &Run) -> Seen {
    let messages = &run.messages;
    let mut cut = messages.len().saturating_sub(20);
    while cut > 1 && messages[cut]["role"] == "tool" {
        cut -= 1;
    }
    let evicted = &messages[1..cut];
    let mut budget = 4_000u64;
    let mut start = evicted.len();
    while start > 0 && approx_tokens(&evicted[start - 1]) <= budget {
        budget -= approx_tokens(&evicted[start - 1]);
        start -= 1;
    }
    while start < evicted.len() && evicted[start]["role"] != "user" {
        start += 1;
    }
    let shown: Vec<String> = evicted[start..].iter().map(Value::to_string).collect();
    let kept: Vec<String> = messages[cut..].iter().map(Value::to_string).collect();
    Seen {
        kept: kept.join("\n"),
        summary: String::new(),
        shown: shown.join("\n"),
    }
}

/// Oldest messages after the system prompt dropped until the rest is under the trigger ×
/// headroom, with no regard for tool-call pairs and nothing summarized.
fn naive_truncation(run: &Run) -> Seen {
    let messages = &run.messages;
    let mut total: u64 = messages.iter().map(approx_tokens).sum();
    let mut start = 1;
    while total > TRIGGER * 3 / 4 && start < messages.len() - 1 {
        total -= approx_tokens(&messages[start]);
        start += 1;
    }
    let kept: Vec<String> = std::iter::once(&messages[0])
        .chain(&messages[start..])
        .map(Value::to_string)
        .collect();
    Seen {
        kept: kept.join("\n"),
        summary: String::new(),
        shown: String::new(),
    }
}

fn fate(marker: &str, seen: &Seen) -> Fate {
    if seen.kept.contains(marker) {
        Fate::Kept
    } else if seen.summary.contains(marker) {
        Fate::InSummary
    } else if seen.shown.contains(marker) {
        Fate::Shown
    } else {
        Fate::Lost
    }
}

/// Strategy → kind → counts per fate over every run.
type Table = BTreeMap<&'static str, BTreeMap<&'static str, Fates>>;

async fn evaluate() -> (Table, BTreeMap<&'static str, Fates>) {
    let (summary, summary_seen) = engine("[summarize]", "");
    let (unindexed, unindexed_seen) = engine("[summarize]", "  identifier_index: 0\n");
    let (clearing, clearing_seen) = engine("[clear_tool_outputs]", "");
    let (truncating, truncating_seen) = engine("[truncate]", "");
    let mut table = Table::new();
    let mut by_language: BTreeMap<&'static str, Fates> = BTreeMap::new();
    for language in LANGUAGES {
        for seed in 0..RUNS_PER_LANGUAGE {
            let run = agent_run(language, seed, PIPELINE);
            let outcomes = [
                through_engine(&summary, &summary_seen, &run).await,
                through_engine(&unindexed, &unindexed_seen, &run).await,
                through_engine(&clearing, &clearing_seen, &run).await,
                through_engine(&truncating, &truncating_seen, &run).await,
                langchain(&run),
                naive_truncation(&run),
            ];
            for (strategy, seen) in STRATEGIES.iter().zip(&outcomes) {
                for planted in &run.planted {
                    let fate = fate(&planted.marker, seen) as usize;
                    table
                        .entry(strategy)
                        .or_default()
                        .entry(planted.kind)
                        .or_default()[fate] += 1;
                    if *strategy == STRATEGIES[0] {
                        by_language.entry(language).or_default()[fate] += 1;
                    }
                }
            }
        }
    }
    (table, by_language)
}

fn percent(counts: Fates, fate: Fate) -> f64 {
    let total: u32 = counts.iter().sum();
    100.0 * counts[fate as usize] as f64 / total.max(1) as f64
}

fn print(table: &Table) {
    println!(
        "\n| strategy | planted fact | kept verbatim | in the forwarded summary | only shown to the summarizer | lost outright |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for strategy in STRATEGIES {
        for kind in KINDS {
            let counts = table[strategy][kind];
            println!(
                "| {strategy} | {kind} | {:.0} % | {:.0} % | {:.0} % | {:.0} % |",
                percent(counts, Fate::Kept),
                percent(counts, Fate::InSummary),
                percent(counts, Fate::Shown),
                percent(counts, Fate::Lost)
            );
        }
    }
}

/// Writes the model tier's runs, one JSON object a line (`language`, `seed`, `messages`, and
/// `planted`: each fact's `kind` and `marker`), where `COMPACTOR_EVAL_RUNS` names a file.
fn write_model_tier_runs() {
    let Ok(path) = std::env::var("COMPACTOR_EVAL_RUNS") else {
        return;
    };
    let mut lines = String::new();
    for language in LANGUAGES {
        for seed in 0..RUNS_PER_LANGUAGE {
            let run = agent_run(language, seed, MODEL_TIER);
            let planted: Vec<Value> = run
                .planted
                .iter()
                .map(|p| json!({"kind": p.kind, "marker": p.marker}))
                .collect();
            let line = json!({"language": language, "seed": seed, "messages": run.messages, "planted": planted});
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
    }
    std::fs::write(&path, lines).expect("COMPACTOR_EVAL_RUNS is writable");
}

#[tokio::test]
async fn no_planted_fact_is_lost_outright_by_compactors_summary_and_the_references_lose_some() {
    write_model_tier_runs();
    let (table, by_language) = evaluate().await;
    print(&table);
    let runs = RUNS_PER_LANGUAGE as u32 * LANGUAGES.len() as u32;
    for kind in KINDS {
        let summary = table[STRATEGIES[0]][kind];
        assert_eq!(summary.iter().sum::<u32>(), runs);
        assert_eq!(summary[Fate::Lost as usize], 0, "{kind}: {summary:?}");
        // The negative control: this summarizer writes one constant line, so without the
        // identifier index no planted fact reaches the forwarded summary.
        let unindexed = table[STRATEGIES[1]][kind];
        assert_eq!(
            unindexed[Fate::InSummary as usize],
            0,
            "{kind}: {unindexed:?}"
        );
    }
    for (language, counts) in by_language {
        assert_eq!(counts[Fate::Lost as usize], 0, "{language}");
    }
    // What the index buys, whatever the summarizer writes: most planted facts reach the model
    // verbatim in the summary.
    let in_summary: u32 = KINDS
        .iter()
        .map(|kind| table[STRATEGIES[0]][kind][Fate::InSummary as usize])
        .sum();
    assert!(in_summary * 2 > runs * KINDS.len() as u32, "{in_summary}");
    // The planted facts sit where a compaction evicts: the references do lose some of them.
    let lost_by_langchain: u32 = KINDS
        .iter()
        .map(|kind| table[STRATEGIES[4]][kind][Fate::Lost as usize])
        .sum();
    assert!(lost_by_langchain > 0);
}
