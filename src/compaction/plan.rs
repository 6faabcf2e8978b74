//! The compaction planner (DESIGN.md §2): pure, no I/O, no clock.
//!
//! Given a parsed request, settings and (through [`SummaryLookup`]) the summary cache, it decides
//! to pass through, to reuse a cached summary, or to summarize a precise set of messages, and
//! which messages stay verbatim and where. Everything it returns is checked again by
//! [`super::rewrite::validate`] before a byte is sent.

use std::collections::HashMap;

use super::conversation::{Conversation, Role};
use super::digest::{prefix_chain, Digest};
use super::rewrite::validate_layout;
use super::tokens::TokenModel;
use crate::config::{ContextSize, SummarizationConfig};

/// The settings the planner reads, in the reference's vocabulary.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub triggers: Vec<ContextSize>,
    pub keep: ContextSize,
    /// Compacted request must be under `headroom × threshold` for every trigger.
    pub headroom: Option<f64>,
    /// Size assumed for a summary that does not exist yet (`summary_max_tokens` + framing).
    pub summary_estimate_tokens: u64,
    pub skills: SkillRescue,
}

#[derive(Debug, Clone)]
pub struct SkillRescue {
    pub max_count: u64,
    pub max_tokens: u64,
    pub max_tokens_per_skill: u64,
    pub tool_names: Vec<String>,
    pub container_path: String,
}

impl PlanSettings {
    pub fn from_config(config: &SummarizationConfig) -> PlanSettings {
        PlanSettings {
            triggers: config.trigger.to_vec(),
            keep: config.keep,
            headroom: config.headroom,
            // The summary message's framing ("Here is a summary…", role) on top of its text.
            summary_estimate_tokens: config.summary_max_tokens + 16,
            skills: SkillRescue {
                max_count: config.preserve_recent_skill_count,
                max_tokens: config.preserve_recent_skill_tokens,
                max_tokens_per_skill: config.preserve_recent_skill_tokens_per_skill,
                tool_names: config.skill_file_read_tool_names.clone(),
                container_path: config.skills_container_path.clone(),
            },
        }
    }
}

/// A summary the cache holds for a prefix of this conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedSummary {
    /// The summary covers `messages[head..cut]` less `excluded`.
    pub cut: usize,
    /// Messages inside the summarized range kept verbatim (moved user, rescued groups), in order.
    pub excluded: Vec<usize>,
    pub text: String,
    /// Estimated tokens of the summary message.
    pub tokens: u64,
}

/// The planner's window on the cache: used only when the request is over a trigger.
pub trait SummaryLookup {
    /// Seeds the prefix chain, so that the chain's digests are the cache keys of one scope
    /// (tenant and summarizer settings) and no further hashing is needed per probe.
    fn chain_seed(&mut self) -> Digest;
    /// The summary cached under a prefix digest.
    fn get(&mut self, prefix: &Digest) -> Option<CachedSummary>;
}

/// No cache: every over-trigger request is summarized from scratch.
pub struct NoCache;

impl SummaryLookup for NoCache {
    fn chain_seed(&mut self) -> Digest {
        [0; 32]
    }
    fn get(&mut self, _: &Digest) -> Option<CachedSummary> {
        None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Threshold {
    Tokens(u64),
    Messages(u64),
}

/// Where the conversation is cut and what stays verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Leading system/developer messages, pinned first.
    pub head: usize,
    /// `messages[cut..]` is kept verbatim.
    pub cut: usize,
    /// Messages before `cut` kept verbatim after the summary: the latest user message if the
    /// cut passed it, then rescued skill groups, in original order.
    pub excluded: Vec<usize>,
    /// Estimated tokens of the compacted request (with the summary's estimate or real size).
    pub projected_tokens: u64,
    pub headroom_unmet: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Forward the original bytes.
    PassThrough { reason: &'static str },
    /// Use this cached summary; no summarizer call.
    Reuse {
        layout: Layout,
        summary: CachedSummary,
    },
    /// Summarize `to_summarize` (on top of `previous` when given).
    Summarize {
        layout: Layout,
        to_summarize: Vec<usize>,
        previous: Option<CachedSummary>,
        /// Estimated tokens the new summary replaces: the summarized messages plus the previous
        /// summary. A summary that is not smaller is not worth using.
        replaced_tokens: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    pub tokens_before: u64,
    /// The prefix chain, when the request was over a trigger (for storing a new summary).
    pub chain: Option<Vec<Digest>>,
    pub cache_consulted: bool,
    pub cache_hit: bool,
}

/// A tool-call group that read skill files: rescued whole.
struct SkillBundle {
    start: usize,
    /// The group's messages: the assistant and every result answering it.
    members: Vec<usize>,
    /// Tokens of the whole group (assistant and every result), which is what stays verbatim.
    tokens: u64,
    /// The group's skill paths, sorted and joined: one bundle per distinct set.
    key: String,
}

/// Per-request facts every step reads.
struct Analysis {
    tokens: Vec<u64>,
    /// `suffix[i]` = tokens of `messages[i..]`.
    suffix: Vec<u64>,
    pinned_tokens: u64,
    schema_tokens: u64,
    head: usize,
    /// `valid_cut[c]`: no tool-call group has members on both sides of `c`.
    valid_cut: Vec<bool>,
    /// The largest cut that keeps the last group whole.
    max_cut: usize,
    latest_user: Option<usize>,
    thresholds: Vec<Threshold>,
    model: TokenModel,
    skill_bundles: Vec<SkillBundle>,
}

/// Plans one request. `force` compacts even under every trigger (`x-compactor: force`).
pub fn plan(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
    force: bool,
    cache: &mut dyn SummaryLookup,
) -> Plan {
    let tokens = conversation.message_tokens(model);
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    let tokens_before = conversation.schema_tokens(model) + tokens.iter().sum::<u64>();
    let pass = |reason| Plan {
        decision: Decision::PassThrough { reason },
        tokens_before,
        chain: None,
        cache_consulted: false,
        cache_hit: false,
    };
    // Threshold first: under every trigger nothing else is computed and the cache is not read.
    if !force
        && !over_any(
            &thresholds,
            tokens_before,
            conversation.messages.len() as u64,
            1.0,
        )
    {
        return pass("under_trigger");
    }
    let analysis = Analysis::new(conversation, settings, model, tokens, thresholds);
    if analysis.max_cut <= analysis.head {
        return pass("nothing_to_summarize");
    }
    let chain = prefix_chain(&conversation.messages, cache.chain_seed());
    // The longest cached prefix: summaries are only ever stored at valid cuts.
    let cached = (analysis.head + 1..=analysis.max_cut)
        .rev()
        .filter(|&len| analysis.valid_cut[len])
        .find_map(|len| cache.get(&chain[len]).filter(|c| c.cut == len))
        .filter(|c| analysis.usable(c));
    let mut decision = match &cached {
        Some(summary) => analysis.plan_with_cache(settings, summary.clone(), force),
        None => analysis.plan_fresh(settings),
    };
    // A layout whose verbatim messages do not form a valid list (the request itself has an
    // unanswered call or an orphan result) is never worth a summarizer call.
    if let Decision::Summarize { layout, .. } | Decision::Reuse { layout, .. } = &decision {
        if validate_layout(conversation, layout).is_err() {
            decision = Decision::PassThrough {
                reason: "invalid_tool_structure",
            };
        }
    }
    Plan {
        decision,
        tokens_before,
        cache_hit: cached.is_some(),
        chain: Some(chain),
        cache_consulted: true,
    }
}

/// Whether the request is over any trigger (threshold-first check, nothing else computed).
pub fn over_trigger(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    model: &TokenModel,
) -> (bool, u64) {
    let tokens =
        conversation.schema_tokens(model) + conversation.message_tokens(model).iter().sum::<u64>();
    let thresholds = thresholds(settings, model, conversation.output_reserve);
    (
        over_any(&thresholds, tokens, conversation.messages.len() as u64, 1.0),
        tokens,
    )
}

fn thresholds(settings: &PlanSettings, model: &TokenModel, output_reserve: u64) -> Vec<Threshold> {
    settings
        .triggers
        .iter()
        .filter_map(|size| threshold(*size, model, output_reserve))
        .collect()
}

/// Whether (tokens, messages) reach `factor ×` any threshold (`>=`).
fn over_any(thresholds: &[Threshold], tokens: u64, messages: u64, factor: f64) -> bool {
    thresholds.iter().any(|t| match *t {
        Threshold::Tokens(v) => tokens as f64 >= factor * v as f64,
        Threshold::Messages(v) => messages as f64 >= factor * v as f64,
    })
}

impl Analysis {
    fn new(
        conversation: &Conversation<'_>,
        settings: &PlanSettings,
        model: &TokenModel,
        tokens: Vec<u64>,
        thresholds: Vec<Threshold>,
    ) -> Self {
        let messages = &conversation.messages;
        let n = messages.len();
        let mut suffix = vec![0u64; n + 1];
        for i in (0..n).rev() {
            suffix[i] = suffix[i + 1] + tokens[i];
        }
        let head = messages
            .iter()
            .take_while(|m| m.role.is_instruction())
            .count();
        let pinned_tokens = tokens[..head].iter().sum();

        // Groups: an assistant with tool calls plus every later tool message answering one of
        // its ids, adjacent or not. A cut strictly inside a group's span would split it.
        let mut group_start: Vec<usize> = (0..n).collect();
        let mut group_end: Vec<usize> = (0..n).collect();
        let mut owner: HashMap<&str, usize> = HashMap::new();
        for (i, message) in messages.iter().enumerate() {
            if message.has_tool_calls() {
                for call in &message.tool_calls {
                    owner.insert(call.id.as_ref(), i);
                }
            } else if message.role == Role::Tool {
                if let Some(&start) = message.tool_call_id.as_deref().and_then(|id| owner.get(id)) {
                    group_start[i] = start;
                    group_end[start] = group_end[start].max(i);
                }
            }
        }
        for i in 0..n {
            group_end[i] = group_end[group_start[i]];
        }
        let mut depth = vec![0i64; n + 2];
        for start in 0..n {
            if group_start[start] == start && group_end[start] > start {
                depth[start + 1] += 1;
                depth[group_end[start] + 1] -= 1;
            }
        }
        let mut valid_cut = vec![true; n + 1];
        let mut running = 0;
        for (c, valid) in valid_cut.iter_mut().enumerate() {
            running += depth[c];
            *valid = running == 0;
        }
        let last_group_start = if n == 0 { 0 } else { group_start[n - 1] };
        let max_cut = (0..=last_group_start)
            .rev()
            .find(|&c| valid_cut[c])
            .unwrap_or(0);
        let latest_user = messages.iter().rposition(|m| m.role == Role::User);
        let skill_bundles =
            skill_bundles(conversation, settings, &tokens, &group_start, &group_end);
        Analysis {
            skill_bundles,
            tokens,
            suffix,
            pinned_tokens,
            schema_tokens: conversation.schema_tokens(model),
            head,
            valid_cut,
            max_cut,
            latest_user,
            thresholds,
            model: *model,
        }
    }

    fn n(&self) -> usize {
        self.tokens.len()
    }

    fn over_any(&self, tokens: u64, messages: u64, factor: f64) -> bool {
        over_any(&self.thresholds, tokens, messages, factor)
    }

    /// Whether the compacted size satisfies headroom (strictly under `headroom × threshold`).
    fn within_headroom(&self, tokens: u64, messages: u64, headroom: Option<f64>) -> bool {
        match headroom {
            None => true,
            Some(h) => !self.over_any(tokens, messages, h),
        }
    }

    fn usable(&self, cached: &CachedSummary) -> bool {
        cached.cut > self.head
            && cached.cut <= self.max_cut
            && self.valid_cut[cached.cut]
            && cached
                .excluded
                .iter()
                .all(|&i| i >= self.head && i < cached.cut)
    }

    /// (tokens, messages) of `[pinned, summary, excluded…, messages[cut..]]`.
    fn projected(&self, cut: usize, excluded: &[usize], summary_tokens: u64) -> (u64, u64) {
        let excluded_tokens: u64 = excluded.iter().map(|&i| self.tokens[i]).sum();
        let tokens = self.schema_tokens
            + self.pinned_tokens
            + summary_tokens
            + excluded_tokens
            + self.suffix[cut];
        let messages = (self.head + 1 + excluded.len() + (self.n() - cut)) as u64;
        (tokens, messages)
    }

    /// The cut `keep` asks for, before group boundaries.
    fn keep_cut(&self, keep: ContextSize) -> usize {
        let n = self.n();
        let by_tokens = |budget: u64| {
            let budget = budget.max(1);
            if self.suffix[self.head] <= budget {
                return self.head;
            }
            // suffix[] is non-increasing: binary search for the first suffix within budget.
            let (mut lo, mut hi) = (self.head, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.suffix[mid] <= budget {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            // The last message is kept even when it alone is over budget.
            lo.min(n.saturating_sub(1))
        };
        match keep {
            ContextSize::Messages(count) => n.saturating_sub(count as usize).max(self.head),
            ContextSize::Tokens(budget) => by_tokens(budget),
            ContextSize::Fraction(f) => match self.model.max_input_tokens {
                Some(window) => by_tokens((window as f64 * f) as u64),
                // The reference's fallback when no window is known.
                None => n.saturating_sub(20).max(self.head),
            },
        }
    }

    /// The nearest valid cut at or before `raw` (keeping more, never splitting a group).
    fn boundary_at_or_before(&self, raw: usize) -> usize {
        let raw = raw.min(self.max_cut);
        (self.head..=raw)
            .rev()
            .find(|&c| self.valid_cut[c])
            .unwrap_or(self.head)
    }

    fn next_boundary(&self, cut: usize) -> Option<usize> {
        (cut + 1..=self.max_cut).find(|&c| self.valid_cut[c])
    }

    /// Moved user + rescued groups for a cut, with `floor`: groups starting before it may only
    /// be rescued if already in `carried` (a cached summary cannot be un-summarized).
    fn excluded_for(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
    ) -> Vec<usize> {
        let mut excluded: Vec<usize> = Vec::new();
        if let Some(u) = self.latest_user.filter(|&u| u >= self.head && u < cut) {
            if u >= floor || carried.contains(&u) {
                excluded.push(u);
            }
        }
        for bundle in self.rescued_groups(settings, cut, floor, carried) {
            excluded.extend_from_slice(&bundle.members);
        }
        excluded.sort_unstable();
        excluded.dedup();
        excluded
    }

    /// Skill groups inside `[head, cut)` kept verbatim: newest first within the count, total and
    /// per-skill budgets, one per distinct set of paths.
    fn rescued_groups(
        &self,
        settings: &PlanSettings,
        cut: usize,
        floor: usize,
        carried: &[usize],
    ) -> Vec<&SkillBundle> {
        let skills = &settings.skills;
        let mut chosen = Vec::new();
        let mut seen_keys: Vec<&str> = Vec::new();
        let mut total = 0u64;
        for bundle in self.skill_bundles.iter().rev() {
            if bundle.start >= cut || bundle.start < self.head {
                continue;
            }
            if bundle.start < floor && !carried.contains(&bundle.start) {
                continue;
            }
            if chosen.len() as u64 >= skills.max_count {
                break;
            }
            if seen_keys.contains(&bundle.key.as_str()) {
                continue;
            }
            if bundle.tokens > skills.max_tokens_per_skill
                || total + bundle.tokens > skills.max_tokens
            {
                continue;
            }
            total += bundle.tokens;
            seen_keys.push(&bundle.key);
            chosen.push(bundle);
        }
        chosen.reverse();
        chosen
    }

    /// Advances `cut` group by group until the compacted request is within headroom.
    fn apply_headroom(
        &self,
        settings: &PlanSettings,
        mut cut: usize,
        floor: usize,
        carried: &[usize],
        summary_tokens: u64,
    ) -> Layout {
        loop {
            let excluded = self.excluded_for(settings, cut, floor, carried);
            let (tokens, messages) = self.projected(cut, &excluded, summary_tokens);
            let fits = self.within_headroom(tokens, messages, settings.headroom);
            match self.next_boundary(cut) {
                Some(next) if !fits => cut = next,
                _ => {
                    return Layout {
                        head: self.head,
                        cut,
                        excluded,
                        projected_tokens: tokens,
                        headroom_unmet: !fits,
                    }
                }
            }
        }
    }

    fn plan_fresh(&self, settings: &PlanSettings) -> Decision {
        let start = self.boundary_at_or_before(self.keep_cut(settings.keep));
        let layout = self.apply_headroom(
            settings,
            start,
            self.head,
            &[],
            settings.summary_estimate_tokens,
        );
        let to_summarize: Vec<usize> = (self.head..layout.cut)
            .filter(|i| !layout.excluded.contains(i))
            .collect();
        if to_summarize.is_empty() {
            return Decision::PassThrough {
                reason: "nothing_to_summarize",
            };
        }
        Decision::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize),
            layout,
            to_summarize,
            previous: None,
        }
    }

    fn plan_with_cache(
        &self,
        settings: &PlanSettings,
        cached: CachedSummary,
        force: bool,
    ) -> Decision {
        let (tokens, messages) = self.projected(cached.cut, &cached.excluded, cached.tokens);
        let reuse_layout = |headroom_unmet| Layout {
            head: self.head,
            cut: cached.cut,
            excluded: cached.excluded.clone(),
            projected_tokens: tokens,
            headroom_unmet,
        };
        // Sticky boundary: while the compacted request stays under every trigger, reuse.
        if !force && !self.over_any(tokens, messages, 1.0) {
            return Decision::Reuse {
                layout: reuse_layout(false),
                summary: cached,
            };
        }
        let start = self
            .boundary_at_or_before(self.keep_cut(settings.keep))
            .max(cached.cut);
        let layout = self.apply_headroom(
            settings,
            start,
            cached.cut,
            &cached.excluded,
            settings.summary_estimate_tokens,
        );
        let to_summarize: Vec<usize> = (self.head..layout.cut)
            .filter(|i| !layout.excluded.contains(i))
            .filter(|&i| i >= cached.cut || cached.excluded.contains(&i))
            .collect();
        if to_summarize.is_empty() {
            // Nothing new can be summarized: the cached summary is as far as compaction goes.
            return Decision::Reuse {
                layout: reuse_layout(true),
                summary: cached,
            };
        }
        Decision::Summarize {
            replaced_tokens: self.tokens_of(&to_summarize) + cached.tokens,
            layout,
            to_summarize,
            previous: Some(cached),
        }
    }

    fn tokens_of(&self, indices: &[usize]) -> u64 {
        indices.iter().map(|&i| self.tokens[i]).sum()
    }
}

/// Every group whose calls read skill files (name in the configured list, path under the
/// container) and got their results.
fn skill_bundles(
    conversation: &Conversation<'_>,
    settings: &PlanSettings,
    tokens: &[u64],
    group_start: &[usize],
    group_end: &[usize],
) -> Vec<SkillBundle> {
    let skills = &settings.skills;
    if skills.max_count == 0 || skills.max_tokens == 0 {
        return Vec::new();
    }
    let messages = &conversation.messages;
    let mut bundles = Vec::new();
    for (start, message) in messages.iter().enumerate() {
        if !message.has_tool_calls() || group_start[start] != start {
            continue;
        }
        let reads_skills = message
            .tool_calls
            .iter()
            .any(|call| skills.tool_names.iter().any(|n| n == call.name.as_ref()));
        if !reads_skills {
            continue;
        }
        let members: Vec<usize> = (start..=group_end[start])
            .filter(|&i| group_start[i] == start)
            .collect();
        let answered: Vec<&str> = members
            .iter()
            .filter_map(|&i| messages[i].tool_call_id.as_deref())
            .collect();
        let mut paths: Vec<String> = message
            .tool_calls
            .iter()
            .filter(|call| answered.contains(&call.id.as_ref()))
            .filter(|call| skills.tool_names.iter().any(|n| n == call.name.as_ref()))
            .filter_map(|call| skill_path(&call.arguments(), &skills.container_path))
            .collect();
        if paths.is_empty() {
            continue;
        }
        paths.sort();
        bundles.push(SkillBundle {
            start,
            tokens: members.iter().map(|&i| tokens[i]).sum(),
            members,
            key: paths.join("|"),
        });
    }
    bundles
}

fn threshold(size: ContextSize, model: &TokenModel, output_reserve: u64) -> Option<Threshold> {
    match size {
        ContextSize::Tokens(v) => Some(Threshold::Tokens(v)),
        ContextSize::Messages(v) => Some(Threshold::Messages(v)),
        // Skipped (never failed) when the model's window is unknown.
        ContextSize::Fraction(f) => model.max_input_tokens.map(|window| {
            let usable = window.saturating_sub(output_reserve);
            Threshold::Tokens(((usable as f64 * f).floor() as u64).max(1))
        }),
    }
}

/// The skill file a read call targets, when it lies under `container` (after resolving `.` and
/// `..`, so `/mnt/skills/../etc` is not a skill).
fn skill_path(arguments: &str, container: &str) -> Option<String> {
    let args: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let path = ["path", "file_path", "filepath"]
        .iter()
        .filter_map(|key| args.get(key).and_then(|v| v.as_str()))
        .find(|p| !p.is_empty())?;
    let normalized = normalize_path(path);
    let root = normalize_path(container);
    let root = root.trim_end_matches('/');
    (normalized == root || normalized.starts_with(&format!("{root}/"))).then_some(normalized)
}

fn normalize_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if path.starts_with('/') {
        format!("/{joined}")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skill_paths_must_stay_inside_the_container() {
        let container = "/mnt/skills";
        assert_eq!(
            skill_path(r#"{"path":"/mnt/skills/public/a/SKILL.md"}"#, container).as_deref(),
            Some("/mnt/skills/public/a/SKILL.md")
        );
        assert!(skill_path(r#"{"file_path":"/mnt/skills/x"}"#, "/mnt/skills/").is_some());
        assert!(skill_path(r#"{"path":"/mnt/skills/../etc/passwd"}"#, container).is_none());
        assert!(skill_path(r#"{"path":"/mnt/skillsevil/x"}"#, container).is_none());
        assert!(skill_path(r#"{"path":"/mnt/user-data/notes.md"}"#, container).is_none());
        assert!(skill_path("not json", container).is_none());
    }
}
