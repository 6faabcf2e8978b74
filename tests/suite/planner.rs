//! The planner's cases, from the reference's own tests and bugs, in the OpenAI format.

use crate::common::One;
use compactor::apis::chat;
use compactor::apis::chat::summary_message;
use compactor::compaction::planner::digest::Digest;
use compactor::compaction::planner::plan::{
    plan, CachedSummary, Decision, NoCache, Plan, PlanSettings, SummaryLookup,
};
use compactor::compaction::planner::rewrite::rewrite;
use compactor::compaction::planner::skills::SkillRescue;
use compactor::compaction::planner::structure::{validate, Layout, Split};
use compactor::compaction::planner::tokens::TokenModel;
use compactor::compaction::scope::Scope;
use compactor::compaction::summaries::cache::{ScopedLookup, SummaryCache};
use compactor::compaction::summaries::summary_input::{self, InputSettings};
use compactor::compaction::Reason;
use compactor::config::{ContextSize, Oversize, SummaryRole};
use serde_json::{json, Value};

fn body(messages: &[Value]) -> String {
    json!({"model": "gpt-4o-mini", "temperature": 0.3, "messages": messages, "stream": true})
        .to_string()
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}
fn system(text: &str) -> Value {
    json!({"role": "system", "content": text})
}
fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}
fn calls(ids: &[&str]) -> Value {
    let calls: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}))
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}
fn call_named(id: &str, name: &str, args: Value) -> Value {
    json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]})
}
fn result(id: &str, text: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": text})
}

fn skills_off() -> SkillRescue {
    SkillRescue {
        max_count: 0,
        max_tokens: 0,
        max_tokens_per_skill: 0,
        tool_names: vec![],
        container_path: "/mnt/skills".into(),
    }
}

fn settings(triggers: Vec<ContextSize>, keep: ContextSize, headroom: Option<f64>) -> PlanSettings {
    PlanSettings {
        triggers,
        keep,
        headroom,
        // The reference's cases: headroom alone moves the cut (growth room has its own tests).
        headroom_turns: 0,
        summary_estimate_tokens: 50,
        // The reference's cases predate the span rule: any span is worth a summary here.
        min_span_tokens: 1,
        skills: skills_off(),
        stages: Default::default(),
        pinned_context: Vec::new(),
    }
}

fn run(body: &str, settings: &PlanSettings) -> Plan {
    let conversation = chat::parse(body.as_bytes()).expect("parses");
    plan(
        &conversation,
        settings,
        &TokenModel::default(),
        false,
        &mut NoCache,
    )
}

fn summarize_layout(plan: &Plan) -> (&Layout, &Vec<usize>) {
    match &plan.decision {
        Decision::Summarize {
            layout,
            to_summarize,
            ..
        } => (layout, to_summarize),
        other => panic!("expected Summarize, got {other:?}"),
    }
}

/// The rewritten request's messages (after the summary is filled in).
fn rewritten(body: &str, layout: &Layout) -> Vec<Value> {
    let conversation = chat::parse(body.as_bytes()).unwrap();
    let out = rewrite(
        &conversation,
        layout,
        &summary_message("S", SummaryRole::User),
    )
    .expect("valid rewrite");
    let value: Value = serde_json::from_slice(&out).unwrap();
    value["messages"].as_array().unwrap().clone()
}

#[test]
fn cut_on_a_tool_result_moves_back_to_its_assistant() {
    let messages = [
        user("q1"),
        calls(&["a", "b"]),
        result("a", "ra"),
        result("b", "rb"),
        user("q2"),
        assistant("ans"),
    ];
    let text = body(&messages);
    let by_messages = run(
        &text,
        &settings(
            vec![ContextSize::Messages(6)],
            ContextSize::Messages(3),
            None,
        ),
    );
    let (layout, summarized) = summarize_layout(&by_messages);
    assert_eq!(layout.cut, 1);
    assert_eq!(summarized, &vec![0]);

    let conversation = chat::parse(text.as_bytes()).unwrap();
    let tokens = conversation.message_tokens(&TokenModel::default());
    let from_tool_b: u64 = tokens[3..].iter().sum();
    let by_tokens = run(
        &text,
        &settings(
            vec![ContextSize::Messages(6)],
            ContextSize::Tokens(from_tool_b),
            None,
        ),
    );
    assert_eq!(summarize_layout(&by_tokens).0.cut, 1);
}

#[test]
fn a_tool_run_answering_two_assistants_is_never_split() {
    // The reference stops at the first assistant sharing an id (bug #38352) and orphans tool x.
    let messages = [
        user("u"),
        calls(&["x"]),
        calls(&["y"]),
        result("x", "rx"),
        result("y", "ry"),
        user("u2"),
    ];
    let text = body(&messages);
    let plan = run(
        &text,
        &settings(
            vec![ContextSize::Messages(6)],
            ContextSize::Messages(3),
            None,
        ),
    );
    let (layout, _) = summarize_layout(&plan);
    assert_eq!(layout.cut, 1);
    let out = rewritten(&text, layout);
    assert_eq!(out.len(), 6);
    assert_eq!(out[1]["tool_calls"][0]["id"], "x");
    assert_eq!(out[2]["tool_calls"][0]["id"], "y");
}

#[test]
fn non_adjacent_results_stay_with_their_call() {
    let messages = [
        user("u0"),
        calls(&["x"]),
        user("u2"),
        result("x", "rx"),
        user("u4"),
        assistant("a5"),
    ];
    let text = body(&messages);
    for keep in 1..=5 {
        let plan = run(
            &text,
            &settings(
                vec![ContextSize::Messages(1)],
                ContextSize::Messages(keep),
                None,
            ),
        );
        if let Decision::Summarize { layout, .. } = &plan.decision {
            assert!(
                !(2..=3).contains(&layout.cut),
                "keep {keep} split the group at {}",
                layout.cut
            );
            rewritten(&text, layout);
        }
    }
}

#[test]
fn the_system_message_is_pinned_not_summarized() {
    let messages = [system("sys"), user("a"), assistant("b"), user("c")];
    let text = body(&messages);
    let plan = run(
        &text,
        &settings(
            vec![ContextSize::Messages(4)],
            ContextSize::Messages(2),
            None,
        ),
    );
    let (layout, summarized) = summarize_layout(&plan);
    assert_eq!(summarized, &vec![1]);
    let out = rewritten(&text, layout);
    assert_eq!(
        out,
        vec![
            system("sys"),
            json!({"role": "user", "content": "Here is a summary of the conversation to date:\n\nS"}),
            assistant("b"),
            user("c")
        ]
    );
}

#[test]
fn a_long_single_turn_agent_run_compacts_and_keeps_the_request() {
    let mut messages = vec![system("sys"), user("do the task")];
    for k in 1..=12 {
        let id = format!("call_{k}");
        messages.push(calls(&[&id]));
        messages.push(result(&id, &format!("result {k}")));
    }
    let text = body(&messages);
    let plan = run(
        &text,
        &settings(
            vec![ContextSize::Messages(20)],
            ContextSize::Messages(10),
            Some(0.75),
        ),
    );
    let (layout, summarized) = summarize_layout(&plan);
    // Calls 1..7 and their results are summarized; the user's request moves after the summary.
    assert_eq!(summarized, &(2..16).collect::<Vec<_>>());
    assert_eq!(layout.excluded, vec![1]);
    let out = rewritten(&text, layout);
    assert_eq!(out.len(), 13);
    assert_eq!(out[0], system("sys"));
    assert_eq!(out[2], user("do the task"));
    assert_eq!(out[3]["tool_calls"][0]["id"], "call_8");
    assert_eq!(out[12]["tool_call_id"], "call_12");
}

#[test]
fn ten_parallel_calls_leave_nothing_to_summarize() {
    let ids: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut messages = vec![user("q"), calls(&id_refs)];
    messages.extend(ids.iter().map(|id| result(id, "r")));
    let plan = run(
        &body(&messages),
        &settings(
            vec![ContextSize::Messages(2)],
            ContextSize::Messages(3),
            None,
        ),
    );
    assert!(
        matches!(plan.decision, Decision::PassThrough { .. }),
        "{:?}",
        plan.decision
    );
}

struct CountingLookup(usize);

impl SummaryLookup for CountingLookup {
    fn chain_seed(&mut self) -> Digest {
        self.0 += 1;
        [0; 32]
    }
    fn get(&mut self, _: &Digest) -> Option<CachedSummary> {
        self.0 += 1;
        None
    }
}

#[test]
fn under_every_trigger_passes_through_without_looking_at_the_cache() {
    let text = body(&[system("s"), user("hello"), assistant("hi")]);
    let conversation = chat::parse(text.as_bytes()).unwrap();
    let settings = settings(
        vec![ContextSize::Tokens(1000), ContextSize::Messages(10)],
        ContextSize::Messages(2),
        Some(0.75),
    );
    let mut lookup = CountingLookup(0);
    let plan = plan(
        &conversation,
        &settings,
        &TokenModel::default(),
        false,
        &mut lookup,
    );
    assert_eq!(
        plan.decision,
        Decision::PassThrough {
            reason: Reason::UnderTrigger
        }
    );
    assert_eq!(lookup.0, 0);
    assert!(!plan.cache_consulted);
    // One message more reaches the messages trigger (>=) and the cache is consulted.
    let over = settings_with_trigger(ContextSize::Messages(3));
    let plan = compactor::compaction::planner::plan::plan(
        &conversation,
        &over,
        &TokenModel::default(),
        false,
        &mut lookup,
    );
    assert!(lookup.0 >= 1);
    assert!(plan.cache_consulted);
}

fn settings_with_trigger(trigger: ContextSize) -> PlanSettings {
    settings(vec![trigger], ContextSize::Messages(1), None)
}

#[test]
fn fraction_triggers_use_the_window_less_the_output_reserve() {
    let model = TokenModel {
        max_input_tokens: Some(1000),
        ..TokenModel::default()
    };
    // One user message of exactly N tokens: ceil((4 + chars)/4) + 3.
    let message_of = |tokens: u64| user(&"a".repeat(((tokens - 3) * 4 - 4) as usize));
    let check = |tokens: u64, extra: Value| {
        let mut request = json!({"model": "m", "messages": [message_of(tokens)]});
        if let Value::Object(map) = extra {
            request.as_object_mut().unwrap().extend(map);
        }
        let text = request.to_string();
        let conversation = chat::parse(text.as_bytes()).unwrap();
        let settings = settings(
            vec![ContextSize::Fraction(0.8)],
            ContextSize::Messages(1),
            None,
        );
        compactor::compaction::planner::plan::over_trigger(&conversation, &settings, &model).0
    };
    assert!(check(800, json!({})));
    assert!(!check(799, json!({})));
    // 1000 - 100 reserved for the answer = 900 × 0.8 = 720.
    assert!(check(720, json!({"max_tokens": 100})));
    assert!(!check(719, json!({"max_completion_tokens": 100})));
    // No known window: the entry is skipped, never an error.
    let text = body(&[message_of(5000)]);
    let conversation = chat::parse(text.as_bytes()).unwrap();
    let settings = settings(
        vec![ContextSize::Fraction(0.5)],
        ContextSize::Messages(1),
        None,
    );
    assert!(
        !compactor::compaction::planner::plan::over_trigger(
            &conversation,
            &settings,
            &TokenModel::default()
        )
        .0
    );
}

fn padded(role_message: fn(&str) -> Value, tokens: usize) -> Value {
    // ~tokens tokens at 4 chars per token.
    role_message(&"w".repeat(tokens * 4))
}

#[test]
fn headroom_brings_the_compacted_request_under_three_quarters_of_the_trigger() {
    let mut messages = vec![system("sys")];
    for i in 0..30 {
        messages.push(if i % 2 == 0 {
            padded(user, 60)
        } else {
            padded(assistant, 60)
        });
    }
    messages.push(user("latest"));
    let text = body(&messages);
    let settings = PlanSettings {
        summary_estimate_tokens: 100,
        ..settings(
            vec![ContextSize::Tokens(1000)],
            ContextSize::Messages(20),
            Some(0.75),
        )
    };
    let plan = run(&text, &settings);
    let (layout, _) = summarize_layout(&plan);
    assert!(layout.projected_tokens < 750, "{}", layout.projected_tokens);
    assert!(!layout.headroom_unmet);
    // Without headroom, keep 20 alone would leave the request over the trigger.
    let plain = run(
        &text,
        &PlanSettings {
            headroom: None,
            ..settings.clone()
        },
    );
    assert!(summarize_layout(&plain).0.projected_tokens >= 1000);
}

#[test]
fn an_oversized_final_group_keeps_the_minimal_tail_and_says_so() {
    let messages = vec![
        system("sys"),
        padded(user, 300),
        padded(assistant, 300),
        calls(&["big"]),
        result("big", &"r".repeat(4000)),
    ];
    let text = body(&messages);
    let plan = run(
        &text,
        &settings(
            vec![ContextSize::Tokens(1000)],
            ContextSize::Messages(4),
            Some(0.75),
        ),
    );
    let (layout, summarized) = summarize_layout(&plan);
    assert!(layout.headroom_unmet);
    assert_eq!(layout.cut, 3);
    assert_eq!(summarized, &vec![2]);
    assert_eq!(layout.excluded, vec![1]);
}

fn skill_settings(count: u64, total: u64, per_skill: u64) -> PlanSettings {
    PlanSettings {
        skills: SkillRescue {
            max_count: count,
            max_tokens: total,
            max_tokens_per_skill: per_skill,
            tool_names: vec![
                "read_file".into(),
                "read".into(),
                "view".into(),
                "cat".into(),
            ],
            container_path: "/mnt/skills".into(),
        },
        ..settings(
            vec![ContextSize::Messages(8)],
            ContextSize::Messages(2),
            None,
        )
    }
}

/// The reference's `_skill_conversation`: two skill reads, then the current turn.
fn skill_conversation(second_path: &str) -> Vec<Value> {
    vec![
        user("u1"),
        call_named(
            "t1",
            "read_file",
            json!({"path": "/mnt/skills/public/alpha/SKILL.md"}),
        ),
        result("t1", "alpha skill body"),
        user("u2"),
        call_named("t2", "read_file", json!({"path": second_path})),
        result("t2", "beta skill body"),
        user("u3"),
        assistant("final"),
    ]
}

fn rescued_contents(text: &str, settings: &PlanSettings) -> Vec<String> {
    let plan = run(text, settings);
    let (layout, summarized) = summarize_layout(&plan);
    let conversation = chat::parse(text.as_bytes()).unwrap();
    for i in &layout.excluded {
        assert!(!summarized.contains(i));
    }
    rewritten(text, layout);
    layout
        .excluded
        .iter()
        .map(|&i| conversation.messages[i].text())
        .filter(|t| t.contains("skill body"))
        .collect()
}

#[test]
fn skill_reads_are_rescued_newest_first_within_budgets() {
    let text = body(&skill_conversation("/mnt/skills/public/beta/SKILL.md"));
    assert_eq!(
        rescued_contents(&text, &skill_settings(5, 10_000, 10_000)),
        vec!["alpha skill body", "beta skill body"]
    );
    // Count budget: only the newest.
    assert_eq!(
        rescued_contents(&text, &skill_settings(1, 10_000, 10_000)),
        vec!["beta skill body"]
    );
    // Per-skill cap below any group: nothing.
    assert!(rescued_contents(&text, &skill_settings(5, 10_000, 1)).is_empty());
    // Count zero disables.
    assert!(rescued_contents(&text, &skill_settings(0, 10_000, 10_000)).is_empty());
    // Total budget fits one group only: the newest, the older one is skipped.
    let conversation = chat::parse(text.as_bytes()).unwrap();
    let tokens = conversation.message_tokens(&TokenModel::default());
    let one_group = tokens[4] + tokens[5];
    assert_eq!(
        rescued_contents(&text, &skill_settings(5, one_group, 10_000)),
        vec!["beta skill body"]
    );
}

#[test]
fn skill_rescue_follows_configured_names_and_container() {
    let custom = body(&[
        user("u1"),
        call_named(
            "t1",
            "custom_read",
            json!({"file_path": "/custom/skills/demo/SKILL.md"}),
        ),
        result("t1", "demo skill body"),
        user("u2"),
        assistant("a"),
        user("u3"),
        assistant("final"),
        user("u4"),
    ]);
    let mut settings = skill_settings(5, 10_000, 10_000);
    assert!(rescued_contents(&custom, &settings).is_empty());
    settings.skills.tool_names = vec!["custom_read".into()];
    settings.skills.container_path = "/custom/skills".into();
    assert_eq!(
        rescued_contents(&custom, &settings),
        vec!["demo skill body"]
    );
}

#[test]
fn non_skill_reads_are_not_rescued_and_paths_are_deduplicated() {
    let outside = body(&skill_conversation("/mnt/user-data/workspace/notes.md"));
    assert_eq!(
        rescued_contents(&outside, &skill_settings(5, 10_000, 10_000)),
        vec!["alpha skill body"]
    );
    let same_path = body(&skill_conversation("/mnt/skills/public/alpha/SKILL.md"));
    // The same skill read twice: only the newest read is kept.
    assert_eq!(
        rescued_contents(&same_path, &skill_settings(5, 10_000, 10_000)),
        vec!["beta skill body"]
    );
}

#[test]
fn a_window_without_any_user_message_still_gets_a_summarizer_input() {
    // The reference trims to "start on a human message" and summarizes nothing (bug #39261).
    let messages = [
        user(&"intro ".repeat(100)),
        calls(&["c"]),
        result("c", &"data ".repeat(200)),
        assistant("done"),
        user("next"),
    ];
    let text = body(&messages);
    let conversation = chat::parse(text.as_bytes()).unwrap();
    let tokens = conversation.message_tokens(&TokenModel::default());
    let input = summary_input::select(
        &conversation,
        &[1, 2, 3],
        &tokens,
        None,
        &InputSettings {
            budget: Some(100),
            oversize: Oversize::Trim,
            max_calls: 4,
            model: TokenModel::default(),
        },
    );
    assert_eq!(input.chunks.len(), 1);
    assert!(input.chunks[0].contains("done"));
    assert!(input.chunks[0].contains("calls lookup"));
}

#[test]
fn other_fields_keep_their_bytes_and_order() {
    let text = r#"{"model":"gpt-4o-mini","temperature":0.30,"messages":[{"role":"user","content":"a","x_custom":[1,2]},{"role":"assistant","content":"b"},{"role":"user","content":"c"}],"tools":null,"zeta":{"k":"v"}}"#;
    let plan = run(
        text,
        &settings(
            vec![ContextSize::Messages(3)],
            ContextSize::Messages(2),
            None,
        ),
    );
    let (layout, _) = summarize_layout(&plan);
    let conversation = chat::parse(text.as_bytes()).unwrap();
    let out = String::from_utf8(
        rewrite(
            &conversation,
            layout,
            &summary_message("S", SummaryRole::User),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(out.starts_with(r#"{"model":"gpt-4o-mini","temperature":0.30,"messages":["#));
    assert!(out.ends_with(r#"{"role":"assistant","content":"b"},{"role":"user","content":"c"}],"tools":null,"zeta":{"k":"v"}}"#));
}

#[test]
fn a_cached_entry_that_names_a_message_twice_or_out_of_order_is_not_used() {
    let mut messages = vec![system("sys")];
    for i in 0..10 {
        messages.push(user(&format!("q{i}")));
        messages.push(assistant(&format!("a{i}")));
    }
    messages.push(user("latest"));
    let settings = settings(
        vec![ContextSize::Messages(20)],
        ContextSize::Messages(6),
        Some(0.75),
    );
    let text = body(&messages);
    let first = run(&text, &settings);
    let (layout, _) = summarize_layout(&first);
    let chain = first.chain().unwrap().to_vec();
    let honest = CachedSummary {
        cut: layout.cut,
        excluded: layout.excluded.clone(),
        splits: layout.splits.clone(),
        text: "S".into(),
        tokens: 20,
    };
    let reused = |cached: CachedSummary| {
        let conversation = chat::parse(text.as_bytes()).unwrap();
        let mut lookup = One(chain[cached.cut], cached);
        let plan = plan(
            &conversation,
            &settings,
            &TokenModel::default(),
            false,
            &mut lookup,
        );
        matches!(plan.decision, Decision::Reuse { .. })
    };
    assert!(reused(honest.clone()), "the entry as made is used");
    for excluded in [vec![1; 50_000], vec![3, 1], vec![2, 2]] {
        let amplified = CachedSummary {
            excluded: excluded.clone(),
            ..honest.clone()
        };
        assert!(!reused(amplified), "excluded {:?}…", &excluded[..2]);
    }
    let split_outside = CachedSummary {
        excluded: vec![1],
        splits: vec![Split {
            message: 2,
            calls: vec![0],
        }],
        ..honest.clone()
    };
    assert!(!reused(split_outside), "a split of a message not kept back");
    let repeated_calls = CachedSummary {
        excluded: vec![1],
        splits: vec![Split {
            message: 1,
            calls: vec![0; 1000],
        }],
        ..honest.clone()
    };
    assert!(!reused(repeated_calls), "one call named a thousand times");
    // Signed (by a replica of this deployment, or by whoever holds its key) and recounted, a
    // summary larger than the messages it stands for would grow the body: not used.
    let bloated = CachedSummary {
        text: "S".repeat(40_000),
        tokens: 10_000,
        ..honest
    };
    assert!(!reused(bloated), "a summary larger than what it replaces");
}

#[test]
fn reuse_while_the_compacted_request_stays_under_the_trigger() {
    let mut messages = vec![system("sys")];
    for i in 0..10 {
        messages.push(user(&format!("q{i}")));
        messages.push(assistant(&format!("a{i}")));
    }
    messages.push(user("latest"));
    let settings = settings(
        vec![ContextSize::Messages(20)],
        ContextSize::Messages(6),
        Some(0.75),
    );
    let text = body(&messages);
    let first = run(&text, &settings);
    let (layout, _) = summarize_layout(&first);
    let cached = CachedSummary {
        cut: layout.cut,
        excluded: layout.excluded.clone(),
        splits: layout.splits.clone(),
        text: "S".into(),
        tokens: 20,
    };
    let chain = first.chain().unwrap().to_vec();
    let mut lookup = One(chain[cached.cut], cached.clone());
    // Next turn: the client resends everything plus one exchange.
    messages.push(assistant("answer"));
    messages.push(user("follow-up"));
    let next = body(&messages);
    let conversation = chat::parse(next.as_bytes()).unwrap();
    let second = plan(
        &conversation,
        &settings,
        &TokenModel::default(),
        false,
        &mut lookup,
    );
    assert!(
        matches!(&second.decision, Decision::Reuse { summary, .. } if summary == &cached),
        "{:?}",
        second.decision
    );
    // Growing until the compacted request reaches the trigger again: incremental summary.
    for i in 0..6 {
        messages.push(assistant(&format!("more {i}")));
        messages.push(user(&format!("again {i}")));
    }
    let later = body(&messages);
    let conversation = chat::parse(later.as_bytes()).unwrap();
    let third = plan(
        &conversation,
        &settings,
        &TokenModel::default(),
        false,
        &mut lookup,
    );
    match &third.decision {
        Decision::Summarize {
            previous: Some(previous),
            to_summarize,
            layout,
            replaced_tokens,
            ..
        } => {
            assert_eq!(previous, &cached);
            assert!(to_summarize.iter().all(|&i| i >= cached.cut));
            assert!(layout.cut > cached.cut);
            // What the new summary replaces: the newly evicted messages and the old summary.
            let tokens = conversation.message_tokens(&TokenModel::default());
            let evicted: u64 = to_summarize.iter().map(|&i| tokens[i]).sum();
            assert_eq!(*replaced_tokens, evicted + cached.tokens);
        }
        other => panic!("expected an incremental summary, got {other:?}"),
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Random conversations: optional system head, then turns of user text, assistant text, or
    /// assistant calls (1–3 parallel) whose results come right after, occasionally interleaved
    /// with another call group.
    fn conversation() -> impl Strategy<Value = Vec<Value>> {
        let turn = prop_oneof![
            3 => (1usize..200).prop_map(|n| vec![user(&"u".repeat(n))]),
            3 => (1usize..200).prop_map(|n| vec![assistant(&"a".repeat(n))]),
            4 => (1usize..4, 1usize..300, any::<bool>()).prop_map(|(k, n, nested)| {
                let ids: Vec<String> = (0..k).map(|i| format!("id{i}")).collect();
                (ids, n, nested)
            }).prop_map(|(ids, n, nested)| {
                // Placeholder ids; made unique below.
                let mut out = vec![calls(&ids.iter().map(String::as_str).collect::<Vec<_>>())];
                if nested {
                    out.push(calls(&["inner"]));
                    out.extend(ids.iter().map(|id| result(id, &"r".repeat(n))));
                    out.push(result("inner", "ri"));
                } else {
                    out.extend(ids.iter().map(|id| result(id, &"r".repeat(n))));
                }
                out
            }),
        ];
        (any::<bool>(), prop::collection::vec(turn, 1..40)).prop_map(|(with_system, turns)| {
            let mut messages = Vec::new();
            if with_system {
                messages.push(system("you are an agent"));
            }
            let mut counter = 0;
            for turn in turns {
                // Unique ids per group so calls never collide across turns.
                let mut map = std::collections::HashMap::new();
                for mut message in turn {
                    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut)
                    {
                        for call in calls {
                            let old = call["id"].as_str().unwrap().to_string();
                            counter += 1;
                            let new = format!("call_{counter}");
                            map.insert(old, new.clone());
                            call["id"] = json!(new);
                        }
                    }
                    if let Some(id) = message
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                    {
                        message["tool_call_id"] = json!(map[&id]);
                    }
                    messages.push(message);
                }
            }
            messages.push(user("the latest question"));
            messages
        })
    }

    fn any_settings() -> impl Strategy<Value = PlanSettings> {
        (
            prop_oneof![
                (1u64..40).prop_map(ContextSize::Messages),
                (50u64..3000).prop_map(ContextSize::Tokens)
            ],
            prop_oneof![
                (1u64..15).prop_map(ContextSize::Messages),
                (10u64..1500).prop_map(ContextSize::Tokens)
            ],
            prop_oneof![Just(None), Just(Some(0.75)), Just(Some(0.5))],
            prop_oneof![Just(1u64), 1u64..300],
        )
            .prop_map(|(trigger, keep, headroom, min_span_tokens)| PlanSettings {
                summary_estimate_tokens: 30,
                min_span_tokens,
                ..settings(vec![trigger], keep, headroom)
            })
    }

    /// Plans `messages` and checks the plan; whether it summarized, and whether the next plan
    /// with that summary cached reused it.
    fn valid_and_stable(
        messages: Vec<Value>,
        settings: PlanSettings,
    ) -> Result<(bool, bool), TestCaseError> {
        let text = body(&messages);
        let conversation = chat::parse(text.as_bytes()).unwrap();
        prop_assert!(validate(conversation.messages.iter()).is_ok());
        let first = plan(
            &conversation,
            &settings,
            &TokenModel::default(),
            false,
            &mut NoCache,
        );
        let Decision::Summarize {
            layout,
            to_summarize,
            ..
        } = &first.decision
        else {
            return Ok((false, false));
        };
        // No call for a span not worth it: over a messages trigger two messages or more (the
        // count shrinks), else a span of at least `min_span_tokens`.
        let model = TokenModel::default();
        let span: u64 = to_summarize
            .iter()
            .map(|&i| conversation.messages[i].tokens(&model))
            .sum();
        let over_messages = matches!(settings.triggers[0], ContextSize::Messages(limit) if conversation.messages.len() as u64 >= limit);
        prop_assert!(
            (over_messages && to_summarize.len() >= 2) || span >= settings.min_span_tokens,
            "span {} < {} ({} messages)",
            span,
            settings.min_span_tokens,
            to_summarize.len()
        );
        // A compaction that met headroom is under it, rescues included, so under every trigger.
        if let (Some(h), false, ContextSize::Tokens(t)) = (
            settings.headroom,
            layout.headroom_unmet,
            settings.triggers[0],
        ) {
            prop_assert!(
                (layout.projected_tokens as f64) < h * t as f64,
                "{} tokens after, trigger {}",
                layout.projected_tokens,
                t
            );
        }
        let out = rewrite(
            &conversation,
            layout,
            &summary_message("S", SummaryRole::User),
        );
        prop_assert!(out.is_ok(), "{:?}", out);
        let out: Value = serde_json::from_slice(&out.unwrap()).unwrap();
        let out = out["messages"].as_array().unwrap().clone();
        // Pinned head first and unchanged.
        let head = layout.head;
        prop_assert_eq!(&out[..head], &messages[..head]);
        prop_assert_eq!(
            out[head]["content"]
                .as_str()
                .unwrap()
                .starts_with("Here is a summary"),
            true
        );
        // The latest user message is there verbatim.
        prop_assert!(out.contains(messages.last().unwrap()));
        // Kept messages keep their relative order, and nothing is both kept and summarized.
        let kept: Vec<usize> = (0..messages.len())
            .filter(|i| !to_summarize.contains(i))
            .collect();
        prop_assert_eq!(kept.len() + 1, out.len());
        // Order: pinned, summary, excluded (in order), then the tail in order.
        let mut expected = messages[..head].to_vec();
        expected.push(out[head].clone());
        expected.extend(layout.excluded.iter().map(|&i| messages[i].clone()));
        expected.extend(messages[layout.cut..].iter().cloned());
        prop_assert_eq!(&out, &expected);
        // Whatever OpenAI's validation accepted before, it accepts after.
        let before = json!({"messages": messages});
        let after = json!({"messages": out});
        if mock_upstream::validate_messages(&before).is_ok() {
            let verdict = mock_upstream::validate_messages(&after);
            prop_assert!(verdict.is_ok(), "{:?}", verdict);
        }

        // Planning the same request with its summary cached reuses or passes through. The
        // summary is smaller than its span, as every summary compactor keeps is (a larger
        // one is never used: `a_cached_entry_that_names_a_message_twice_or_out_of_order_is_not_used`).
        let tokens = settings.summary_estimate_tokens.min(span.saturating_sub(1));
        let cached = CachedSummary {
            cut: layout.cut,
            excluded: layout.excluded.clone(),
            splits: layout.splits.clone(),
            text: "S".into(),
            tokens,
        };
        let key = first.chain().unwrap()[layout.cut];
        let again = plan(
            &conversation,
            &settings,
            &TokenModel::default(),
            false,
            &mut One(key, cached),
        );
        prop_assert!(
            matches!(
                again.decision,
                Decision::Reuse { .. } | Decision::PassThrough { .. }
            ),
            "{:?}",
            again.decision
        );
        Ok((true, matches!(again.decision, Decision::Reuse { .. })))
    }

    #[test]
    fn plans_are_always_valid_and_stable() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (summarized, reused) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 300,
            ..ProptestConfig::default()
        });
        runner
            .run(&(conversation(), any_settings()), |(messages, settings)| {
                let (made, again) = valid_and_stable(messages, settings)?;
                summarized.fetch_add(usize::from(made), Ordering::Relaxed);
                reused.fetch_add(usize::from(again), Ordering::Relaxed);
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));
        // The checks ran on summaries and their reuse, not only on plans that passed through.
        let (summarized, reused) = (summarized.into_inner(), reused.into_inner());
        eprintln!("{summarized} summaries, {reused} reuses checked");
        assert!(
            summarized >= 60 && reused >= 30,
            "{summarized} summaries, {reused} reuses"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(conversation) = chat::parse(&bytes) {
                let settings = settings(vec![ContextSize::Messages(1)], ContextSize::Messages(1), Some(0.75));
                let _ = plan(&conversation, &settings, &TokenModel::default(), false, &mut NoCache);
            }
        }
    }
}

#[test]
fn once_a_summary_exists_its_real_size_decides_whether_a_new_span_is_worth_a_call() {
    let sentence = "the parser reads one token at a time ";
    let mut messages = vec![system("sys")];
    for i in 0..12 {
        messages.push(user(&format!("q{i} {}", sentence.repeat(2))));
        messages.push(assistant(&format!("a{i} {}", sentence.repeat(2))));
    }
    messages.push(user("latest"));
    let mut settings = settings(
        vec![ContextSize::Tokens(400)],
        ContextSize::Messages(4),
        None,
    );
    // A 500-token summary ceiling: a fresh summary needs a 750-token span to be worth a call.
    settings.min_span_tokens = 750;
    settings.summary_estimate_tokens = 516;
    let text = body(&messages);
    let first = run(
        &text,
        &PlanSettings {
            min_span_tokens: 1,
            ..settings.clone()
        },
    );
    let (layout, _) = summarize_layout(&first);
    // The summary that came back was 30 tokens.
    let cached = CachedSummary {
        cut: layout.cut,
        excluded: layout.excluded.clone(),
        splits: layout.splits.clone(),
        text: "S".into(),
        tokens: 30,
    };
    let mut lookup = One(first.chain().unwrap()[cached.cut], cached.clone());
    messages.pop();
    for i in 0..12 {
        messages.push(assistant(&format!("b{i} {sentence}")));
        messages.push(user(&format!("r{i} {sentence}")));
    }
    let later = body(&messages);
    let conversation = chat::parse(later.as_bytes()).unwrap();
    let plan = plan(
        &conversation,
        &settings,
        &TokenModel::default(),
        false,
        &mut lookup,
    );
    let model = TokenModel::default();
    match &plan.decision {
        Decision::Summarize {
            previous: Some(previous),
            to_summarize,
            ..
        } => {
            assert_eq!(previous, &cached);
            let span: u64 = to_summarize
                .iter()
                .map(|&i| conversation.messages[i].tokens(&model))
                .sum();
            assert!((45..750).contains(&span), "span {span}");
        }
        other => panic!("an incremental summary, not {other:?}"),
    }
}

/// An agent run of `steps` tool calls after one question, each result about `tokens` tokens:
/// every request adds one call and its result.
fn agent_run(steps: usize, tokens: usize) -> Vec<Value> {
    let mut messages = vec![system("sys"), user("fix the build")];
    for step in 0..steps {
        read_step(&mut messages, step, tokens);
    }
    messages
}

/// One agent step of an `agent_run`: a `read_file` call and its result of about `tokens`
/// tokens.
fn read_step(messages: &mut Vec<Value>, step: usize, tokens: usize) {
    read_file(
        messages,
        &format!("read-{step}"),
        &format!("src/f{step}.rs"),
        tokens,
    );
}

/// A `read_file` call of `path` as `id`, and its result of about `tokens` tokens.
fn read_file(messages: &mut Vec<Value>, id: &str, path: &str, tokens: usize) {
    messages.push(call_named(id, "read_file", json!({ "path": path })));
    messages.push(result(id, &"w".repeat(tokens * 4)));
}

fn growth_settings(turns: u64) -> PlanSettings {
    PlanSettings {
        headroom_turns: turns,
        summary_estimate_tokens: 100,
        ..settings(
            vec![ContextSize::Tokens(10_000)],
            ContextSize::Messages(20),
            Some(0.75),
        )
    }
}

/// How many more steps of `tokens` the compacted request takes before it reaches the trigger
/// again: the requests that reuse this summary.
fn steps_until_the_trigger(layout: &Layout, tokens: u64, trigger: u64) -> u64 {
    trigger.saturating_sub(layout.projected_tokens) / tokens
}

#[test]
fn the_cut_leaves_room_for_the_turns_of_growth_it_has_seen() {
    // 600 tokens a step: headroom alone (7 500) leaves room for about 4 steps, ten turns of
    // growth ask for 6 000 tokens of room.
    let text = body(&agent_run(30, 600));
    let headroom_only = run(&text, &growth_settings(0));
    let with_growth = run(&text, &growth_settings(10));
    let (plain, _) = summarize_layout(&headroom_only);
    let (roomy, _) = summarize_layout(&with_growth);
    assert!(
        steps_until_the_trigger(plain, 600, 10_000) < 10,
        "{plain:?}"
    );
    assert!(
        steps_until_the_trigger(roomy, 600, 10_000) >= 9,
        "{roomy:?}"
    );
    assert!(roomy.cut > plain.cut);
    assert!(!roomy.headroom_unmet);
}

/// `keep` asks for everything: headroom and the room for growth alone place the cut.
fn keep_all(settings: PlanSettings) -> PlanSettings {
    PlanSettings {
        keep: ContextSize::Messages(1_000),
        ..settings
    }
}

/// An agent's tasks: `turns` user turns, each answered by `steps` calls of about `tokens`
/// tokens (the client runs them and sends each result) and a closing text, then the user's
/// next turn.
fn tasks_run(turns: usize, steps: usize, tokens: usize) -> Vec<Value> {
    let mut messages = vec![system("sys")];
    for turn in 0..turns {
        messages.push(padded(user, 50));
        for step in 0..steps {
            read_file(
                &mut messages,
                &format!("read-{turn}-{step}"),
                &format!("src/{turn}_{step}.rs"),
                tokens,
            );
        }
        messages.push(padded(assistant, 50));
    }
    messages.push(padded(user, 50));
    messages
}

#[test]
fn an_agent_loop_grows_by_one_response_a_request_whatever_its_request_ends_on() {
    // Steps of about 200 tokens: the growth is one step's, so the cut keeps as much as ten
    // such steps allow, on a request that ends on a tool result and on the one the user's
    // next turn starts. Taking the user turn with its five responses for one request's growth
    // (900 tokens) would cut to half of headroom and summarize the task just done.
    let messages = tasks_run(14, 4, 200);
    let mut mid_task = messages.clone();
    mid_task.truncate(messages.len() - 2);
    for request in [mid_task, messages] {
        let text = body(&request);
        let planned = run(&text, &keep_all(growth_settings(10)));
        let (layout, _) = summarize_layout(&planned);
        assert!(layout.projected_tokens > 5_000, "{layout:?}");
    }
}

/// Plans each request in turn against one replica's own cache, keeping each plan's pace there
/// if `remember`; the last request's plan.
fn plan_in_turn(requests: &[Vec<Value>], settings: &PlanSettings, remember: bool) -> Plan {
    let cache = SummaryCache::new(1 << 20);
    let scope = Scope {
        deployment: [0; 32],
        tenant: [0; 32],
        fingerprint: [0; 32],
    };
    let mut last = None;
    for request in requests {
        let text = body(request);
        let conversation = chat::parse(text.as_bytes()).expect("parses");
        let planned = plan(
            &conversation,
            settings,
            &TokenModel::default(),
            false,
            &mut ScopedLookup::new(&cache, || scope),
        );
        if let (Some(record), true) = (planned.pace, remember) {
            cache.keep_pace(record);
        }
        last = Some(planned);
    }
    last.expect("at least one request")
}

#[test]
fn a_client_sending_one_request_a_user_turn_is_measured_between_its_requests() {
    // Each request is a user turn the client ran four tool calls for before sending it (about
    // 1 000 tokens a request, one response's worth in the history being 200). Measured between
    // requests, the cut leaves room for that pace, as far as the latest responses allow; read off
    // the history alone, it leaves room for ten 200-token steps, under three such requests.
    let requests: Vec<Vec<Value>> = (11..=15).map(|turns| tasks_run(turns, 4, 200)).collect();
    let per_request = {
        let tokens = |messages: &[Value]| run(&body(messages), &growth_settings(0)).tokens_before;
        tokens(&requests[4]) - tokens(&requests[3])
    };
    let settings = keep_all(growth_settings(10));
    let measured = plan_in_turn(&requests, &settings, true);
    let history_only = plan_in_turn(&requests, &settings, false);
    let (measured, _) = summarize_layout(&measured);
    let (history_only, _) = summarize_layout(&history_only);
    assert!(
        steps_until_the_trigger(history_only, per_request, 10_000) < 3,
        "{history_only:?}"
    );
    assert!(
        steps_until_the_trigger(measured, per_request, 10_000) >= 3,
        "{measured:?} ({per_request} tokens a request)"
    );
}

#[test]
fn a_client_sending_one_request_a_user_turn_keeps_its_latest_responses_not_half_of_headroom() {
    // Each request is a user turn of four 200-token steps and a closing text (about 1 000
    // tokens, five responses). Room for ten such requests is more than the trigger: the cut
    // keeps the latest five responses beside the summary, not half of headroom (3 750
    // tokens, three whole user turns), so the summary serves more requests.
    let requests: Vec<Vec<Value>> = (11..=15).map(|turns| tasks_run(turns, 4, 200)).collect();
    let text = body(&requests[4]);
    let planned = plan_in_turn(&requests, &keep_all(growth_settings(10)), true);
    let (layout, _) = summarize_layout(&planned);
    assert!(layout.projected_tokens < 2_500, "{layout:?}");
    let kept = rewritten(&text, layout);
    let results = kept.iter().filter(|m| m["role"] == "tool").count();
    assert!(results >= 3, "{results} results kept: {layout:?}");
}

#[test]
fn a_client_sending_one_request_a_response_keeps_half_of_headroom_when_its_pace_drops() {
    // An agent loop reads ten large files (3 000 tokens each), then nine small ones (100).
    // Measured between its requests the pace still remembers the large reads (ten of them
    // ask for more room than headroom leaves) while the history's latest responses are small;
    // each request still adds one response's messages, so it is not taken for a client
    // sending one request per user turn: the cut keeps half of headroom, every small read,
    // not only the latest five responses.
    let mut messages = vec![system("sys"), user("fix the build")];
    let mut requests = Vec::new();
    for step in 0..19 {
        read_step(&mut messages, step, if step < 10 { 3_000 } else { 100 });
        requests.push(messages.clone());
    }
    let planned = plan_in_turn(&requests, &keep_all(growth_settings(10)), true);
    let (layout, _) = summarize_layout(&planned);
    let kept = rewritten(&body(&messages), layout);
    let small_reads = kept
        .iter()
        .filter(|m| m["role"] == "tool" && m["content"].as_str().is_some_and(|c| c.len() < 1_000))
        .count();
    assert_eq!(small_reads, 9, "{layout:?}");
}

#[test]
fn a_retry_or_a_new_conversation_is_not_taken_for_growth() {
    // A request sent again plans as it did the first time (the pace it measured stands), and
    // a conversation that shares only the system prompt finds no record of another.
    let (previous, request) = (tasks_run(13, 4, 200), tasks_run(14, 4, 200));
    let settings = keep_all(growth_settings(10));
    let once = plan_in_turn(&[previous.clone(), request.clone()], &settings, true);
    let retried = plan_in_turn(
        &[previous.clone(), request.clone(), request.clone()],
        &settings,
        true,
    );
    assert_eq!(summarize_layout(&once).0, summarize_layout(&retried).0);
    let history_only = plan_in_turn(&[previous, request.clone()], &settings, false);
    assert_ne!(summarize_layout(&once).0, summarize_layout(&history_only).0);
    let mut other = request.clone();
    other[1] = padded(user, 51);
    let after_another = plan_in_turn(&[request, other.clone()], &settings, true);
    let alone = plan_in_turn(&[other], &settings, true);
    assert_eq!(
        summarize_layout(&after_another).0,
        summarize_layout(&alone).0
    );
}

#[test]
fn growth_too_fast_for_the_room_still_keeps_recent_steps() {
    // 1 500 tokens a step: ten turns would take more than the whole trigger. The cut takes
    // at most half of headroom for growth and keeps the latest steps verbatim, rather than
    // cutting to the latest message.
    let text = body(&agent_run(20, 1_500));
    let planned = run(&text, &growth_settings(10));
    let (layout, _) = summarize_layout(&planned);
    let kept = rewritten(&text, layout);
    let results = kept.iter().filter(|m| m["role"] == "tool").count();
    assert!(results >= 2, "{} results kept: {layout:?}", results);
    assert!(layout.projected_tokens < 7_500, "{layout:?}");
}

#[test]
fn a_conversation_without_two_responses_yet_has_no_growth_to_leave_room_for() {
    // One long question and no answer: growth is unknown, headroom alone decides.
    let mut messages = vec![system("sys")];
    for i in 0..20 {
        messages.push(padded(user, 600));
        if i == 0 {
            messages.push(padded(assistant, 10));
        }
    }
    let text = body(&messages);
    let (headroom_only, with_growth) = (
        run(&text, &growth_settings(0)),
        run(&text, &growth_settings(10)),
    );
    assert_eq!(
        summarize_layout(&headroom_only).0,
        summarize_layout(&with_growth).0
    );
}
