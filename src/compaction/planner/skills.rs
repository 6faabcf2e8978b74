//! Skill reads (DESIGN.md §2.5): tool-call groups that read files under the skills container,
//! which the planner may keep verbatim instead of summarizing.

use crate::compaction::planner::conversation::Conversation;
use crate::compaction::planner::structure::Groups;

#[derive(Debug, Clone)]
/// The rescue settings: how many skill groups, and how large, may stay verbatim.
pub struct SkillRescue {
    pub max_count: u64,
    pub max_tokens: u64,
    pub max_tokens_per_skill: u64,
    pub tool_names: Vec<String>,
    pub container_path: String,
}

/// The skill reads of one tool-call group: the assistant and the results of its skill calls.
pub struct SkillBundle {
    pub start: usize,
    /// What stays verbatim when rescued: the assistant and its skill results.
    pub members: Vec<usize>,
    /// When the group holds other calls too: the positions of the skill calls, the only ones
    /// the rescued copy of the assistant keeps (the rest of the group is summarized).
    pub split: Option<Vec<usize>>,
    /// Tokens of what stays verbatim.
    pub tokens: u64,
    /// The group's skill paths, sorted and joined: one bundle per distinct set.
    pub key: String,
}

/// Every group whose calls read skill files (name in the configured list, path under the
/// container) and got their results.
pub fn skill_bundles(
    conversation: &Conversation<'_>,
    skills: &SkillRescue,
    tokens: &[u64],
    groups: &Groups,
) -> Vec<SkillBundle> {
    if skills.max_count == 0 || skills.max_tokens == 0 {
        return Vec::new();
    }
    let messages = &conversation.messages;
    let mut bundles = Vec::new();
    for (start, message) in messages.iter().enumerate() {
        if !message.has_tool_calls() || groups.start[start] != start {
            continue;
        }
        let reads_skills = message
            .tool_calls
            .iter()
            .any(|call| skills.tool_names.iter().any(|n| n == call.name.as_ref()));
        if !reads_skills {
            continue;
        }
        let results: Vec<usize> = (start..=groups.end[start])
            .filter(|&i| i != start && groups.start[i] == start)
            .collect();
        let is_skill_call = |call: &&crate::compaction::planner::conversation::ToolCall<'_>| {
            skills.tool_names.iter().any(|n| n == call.name.as_ref())
                && skill_path(&call.arguments(), &skills.container_path).is_some()
        };
        // Skill calls that got their result, with the result that answers each.
        let mut kept_calls = Vec::new();
        let mut members = vec![start];
        let mut paths = Vec::new();
        for (position, call) in message.tool_calls.iter().enumerate() {
            if !is_skill_call(&call) {
                continue;
            }
            let answer = results
                .iter()
                .copied()
                .find(|&i| messages[i].tool_call_id.as_deref() == Some(call.id.as_ref()));
            if let Some(answer) = answer {
                kept_calls.push(position);
                members.push(answer);
                paths.extend(skill_path(&call.arguments(), &skills.container_path));
            }
        }
        if paths.is_empty() {
            continue;
        }
        members.sort_unstable();
        let whole =
            kept_calls.len() == message.tool_calls.len() && members.len() == results.len() + 1;
        paths.sort();
        bundles.push(SkillBundle {
            start,
            tokens: members.iter().map(|&i| tokens[i]).sum(),
            members,
            split: (!whole).then_some(kept_calls),
            key: paths.join("|"),
        });
    }
    bundles
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
