//! Random agent runs through compactor, written once for every API: parallel calls whose
//! results come in any order, text between results where the API allows it, reasoning before
//! a turn, prompt-cache breakpoints, and runs that end on results (the agent loop's next call)
//! or on a user turn. Every request must be accepted by the mock upstream, which refuses what
//! each provider refuses (a call without its result, a result without its call, a broken
//! alternation or signature); and enough of them must be summarized for that to mean something.

use crate::common::*;
use compactor::apis::Api;
use http::StatusCode;
use mock_upstream::anthropic::thinking_signature;
use mock_upstream::MockOptions;
use serde_json::{json, Value};

/// One step of an agent run after the user's task.
enum Step {
    /// The model answers in text; the user says what is next.
    Answer { text: String, reasoning: bool },
    /// The model calls tools in parallel; their results follow, reversed when `reversed`,
    /// with a text between them when `interleaved` (where the API allows it).
    Calls {
        ids: Vec<String>,
        sizes: Vec<usize>,
        reasoning: bool,
        reversed: bool,
        interleaved: bool,
        breakpoint: bool,
    },
}

struct Run {
    task: String,
    steps: Vec<Step>,
}

fn random_run(rng: &mut Rng, seed: u64) -> Run {
    let task = format!("s{seed} task {}", "x".repeat(rng.below(300) as usize));
    let mut call = 0;
    let steps = (0..2 + rng.below(16))
        .map(|_| {
            if rng.below(3) == 0 {
                return Step::Answer {
                    text: format!("s{seed} answer {}", rng.next()),
                    reasoning: rng.below(2) == 0,
                };
            }
            let ids: Vec<String> = (0..1 + rng.below(3))
                .map(|_| {
                    call += 1;
                    format!("call_{seed}_{call}")
                })
                .collect();
            let sizes = ids.iter().map(|_| rng.below(400) as usize).collect();
            Step::Calls {
                ids,
                sizes,
                reasoning: rng.below(2) == 0,
                reversed: rng.below(2) == 0,
                interleaved: rng.below(3) == 0,
                breakpoint: rng.below(5) == 0,
            }
        })
        .collect();
    Run { task, steps }
}

/// The run as `api`'s request: its path, body and headers.
fn render(
    api: Api,
    run: &Run,
) -> (
    &'static str,
    String,
    &'static [(&'static str, &'static str)],
) {
    match api {
        Api::ChatCompletions => ("/v1/chat/completions", chat(run), &[]),
        Api::Responses => ("/v1/responses", responses(run), &[]),
        Api::Messages => ("/v1/messages", messages(run), &ANTHROPIC),
        Api::Gemini => (
            "/v1beta/models/gemini-2.5-flash:generateContent",
            gemini(run),
            &[],
        ),
    }
}

const ANTHROPIC: [(&str, &str); 2] = [
    ("x-api-key", "sk-ant-client"),
    ("anthropic-version", "2023-06-01"),
];

fn output(size: usize) -> String {
    format!("fn f() {{}}\n{}", "x".repeat(size))
}

fn chat(run: &Run) -> String {
    let mut messages = vec![
        json!({"role": "system", "content": "agent"}),
        json!({"role": "user", "content": run.task}),
    ];
    for step in &run.steps {
        match step {
            Step::Answer { text, .. } => {
                messages.push(json!({"role": "assistant", "content": text}));
                messages.push(json!({"role": "user", "content": "next"}));
            }
            Step::Calls {
                ids,
                sizes,
                reversed,
                ..
            } => {
                let calls: Vec<Value> = ids.iter().map(|id| json!({"id": id, "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/mnt/skills/x/SKILL.md\"}"}})).collect();
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
                for (id, size) in in_order(ids, sizes, *reversed) {
                    messages
                        .push(json!({"role": "tool", "tool_call_id": id, "content": output(size)}));
                }
            }
        }
    }
    json!({"model": "gpt-4o-mini", "messages": messages}).to_string()
}

fn responses(run: &Run) -> String {
    let mut input = vec![json!({"role": "user", "content": run.task})];
    let reasoning = |seed: usize| json!({"type": "reasoning", "id": format!("rs_{seed}"), "summary": [{"type": "summary_text", "text": "why"}], "encrypted_content": "e".repeat(64)});
    for (n, step) in run.steps.iter().enumerate() {
        match step {
            Step::Answer {
                text,
                reasoning: thinks,
            } => {
                if *thinks {
                    input.push(reasoning(n));
                }
                input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
                input.push(json!({"role": "user", "content": "next"}));
            }
            Step::Calls {
                ids,
                sizes,
                reasoning: thinks,
                reversed,
                interleaved,
                ..
            } => {
                if *thinks {
                    input.push(reasoning(n));
                }
                for id in ids {
                    input.push(json!({"type": "function_call", "call_id": id, "name": "read_file", "arguments": "{\"path\":\"/mnt/skills/x/SKILL.md\"}"}));
                }
                for (k, (id, size)) in in_order(ids, sizes, *reversed).enumerate() {
                    if k == 1 && *interleaved {
                        input.push(
                            json!({"type": "message", "role": "assistant", "content": "meanwhile"}),
                        );
                    }
                    input.push(json!({"type": "function_call_output", "call_id": id, "output": output(size)}));
                }
            }
        }
    }
    json!({"model": "gpt-4.1", "instructions": "agent", "input": input, "store": false}).to_string()
}

fn messages(run: &Run) -> String {
    let mut messages = vec![json!({"role": "user", "content": run.task})];
    let mut breakpoints_left = 3;
    let thinking = |text: &str| json!({"type": "thinking", "thinking": text, "signature": thinking_signature(text)});
    for step in &run.steps {
        match step {
            Step::Answer { text, reasoning } => {
                let mut content = Vec::new();
                if *reasoning {
                    content.push(thinking("what now?"));
                }
                content.push(json!({"type": "text", "text": text}));
                messages.push(json!({"role": "assistant", "content": content}));
                messages.push(json!({"role": "user", "content": "next"}));
            }
            Step::Calls {
                ids,
                sizes,
                reasoning,
                reversed,
                interleaved,
                breakpoint,
            } => {
                let mut content = Vec::new();
                if *reasoning {
                    content.push(thinking("which files?"));
                }
                content.push(json!({"type": "text", "text": "Reading."}));
                for id in ids {
                    content.push(json!({"type": "tool_use", "id": id, "name": "Read", "input": {"file_path": format!("/src/{id}.rs")}}));
                }
                messages.push(json!({"role": "assistant", "content": content}));
                let mut results: Vec<Value> = in_order(ids, sizes, *reversed)
                    .map(|(id, size)| json!({"type": "tool_result", "tool_use_id": id, "content": output(size)}))
                    .collect();
                if *interleaved {
                    results.push(
                        json!({"type": "text", "text": "<system-reminder>go on</system-reminder>"}),
                    );
                }
                if *breakpoint && breakpoints_left > 0 {
                    breakpoints_left -= 1;
                    if let Some(last) = results.last_mut() {
                        last["cache_control"] = json!({"type": "ephemeral"});
                    }
                }
                messages.push(json!({"role": "user", "content": results}));
            }
        }
    }
    json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": messages,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    })
    .to_string()
}

/// Google's turns: a thought (signed, as Google signs it) before a model turn, the first call
/// of a turn signed, the responses in any order with text between them.
fn gemini(run: &Run) -> String {
    let user = |text: &str| json!({"role": "user", "parts": [{"text": text}]});
    let mut contents = vec![user(&run.task)];
    let thought = |text: &str| json!({"text": text, "thought": true, "thoughtSignature": format!("c2ln-{text}")});
    for step in &run.steps {
        match step {
            Step::Answer { text, reasoning } => {
                let mut parts = Vec::new();
                if *reasoning {
                    parts.push(thought("what now?"));
                }
                parts.push(json!({"text": text}));
                contents.push(json!({"role": "model", "parts": parts}));
                contents.push(user("next"));
            }
            Step::Calls {
                ids,
                sizes,
                reasoning,
                reversed,
                interleaved,
                ..
            } => {
                let mut parts = Vec::new();
                if *reasoning {
                    parts.push(thought("which files?"));
                }
                for (k, id) in ids.iter().enumerate() {
                    let mut call = json!({"functionCall": {"name": "read_file", "args": {"file_path": format!("/src/{id}.rs")}}});
                    if k == 0 && !*reasoning {
                        call["thoughtSignature"] = json!(format!("c2ln-{id}"));
                    }
                    parts.push(call);
                }
                contents.push(json!({"role": "model", "parts": parts}));
                let mut responses: Vec<Value> = in_order(ids, sizes, *reversed)
                    .map(|(_, size)| json!({"functionResponse": {"name": "read_file", "response": {"output": output(size)}}}))
                    .collect();
                if *interleaved {
                    responses.push(json!({"text": "go on"}));
                }
                contents.push(json!({"role": "user", "parts": responses}));
            }
        }
    }
    json!({
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": "You are an agent."}]},
        "generationConfig": {"maxOutputTokens": 1024, "thinkingConfig": {"includeThoughts": true}},
    })
    .to_string()
}

fn in_order<'r>(
    ids: &'r [String],
    sizes: &'r [usize],
    reversed: bool,
) -> Box<dyn Iterator<Item = (&'r String, usize)> + 'r> {
    let pairs = ids.iter().zip(sizes.iter().copied());
    if reversed {
        Box::new(pairs.rev())
    } else {
        Box::new(pairs)
    }
}

#[tokio::test]
async fn random_agent_runs_on_every_api_are_always_accepted_upstream() {
    let stack = stack_with(RANDOM_RUNS_SUMMARIZATION, MockOptions::default()).await;
    for api in Api::ALL {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut summarized = 0;
        for seed in 0..200 {
            let (path, body, headers) = render(api, &random_run(&mut rng, seed));
            let response = roundtrip(
                &client(),
                json_request(&stack.proxy.url(path), body, headers),
            )
            .await;
            assert_eq!(
                response.status,
                StatusCode::OK,
                "{} seed {seed}: {}",
                api.label(),
                response.text()
            );
            if outcome(&response) == "summarized" {
                summarized += 1;
            }
        }
        assert!(
            summarized > 50,
            "{}: only {summarized} of 200 were summarized",
            api.label()
        );
    }
}
