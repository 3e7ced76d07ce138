//! The state graph of a workflow manifest, as deploy-time validation reasons about it.
//!
//! Three questions need the graph rather than one state at a time: which states a run can reach,
//! which states can have run before a given one (so a template may read their output), and which
//! loops a run can never leave. Edges are the transitions a run can actually take: those up to
//! and including a state's first `always` (anything after it is dead, and reported as such).
//! Workflows are small (tens of states), so the closures are computed plainly, per state.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{Map, Value};

/// The live transitions of a workflow's states and what follows from them.
#[derive(Debug)]
pub(crate) struct StateGraph<'a> {
    /// Targets of each state's live transitions (existing states only), in order.
    next: BTreeMap<&'a str, Vec<&'a str>>,
    /// States that a run can reach from the initial state (empty when it does not exist).
    reachable: BTreeSet<&'a str>,
    /// For each state, the states reachable from it in one or more steps.
    after: BTreeMap<&'a str, BTreeSet<&'a str>>,
    /// States that can end a run: `transitions: []`, or a live transition with a null target.
    terminal: BTreeSet<&'a str>,
    /// States with a transition to a state that does not exist (reported elsewhere; such a
    /// transition may be the intended way out of a loop, so a loop through them is not blamed).
    dangling: BTreeSet<&'a str>,
}

impl<'a> StateGraph<'a> {
    /// Builds the graph of `states`, reached from `initial` when that state exists.
    pub(crate) fn new(states: &'a Map<String, Value>, initial: Option<&'a str>) -> Self {
        let mut next = BTreeMap::new();
        let mut terminal = BTreeSet::new();
        let mut dangling = BTreeSet::new();
        for (name, state) in states {
            let transitions = state
                .get("transitions")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            if transitions.is_empty() {
                terminal.insert(name.as_str());
            }
            let mut targets = Vec::new();
            for transition in transitions {
                if transition.get("target").is_some_and(Value::is_null) {
                    terminal.insert(name.as_str());
                }
                if let Some(target) = transition.get("target").and_then(Value::as_str) {
                    match states.get_key_value(target) {
                        Some((key, _)) => targets.push(key.as_str()),
                        None => {
                            dangling.insert(name.as_str());
                        }
                    }
                }
                if transition.get("condition").and_then(Value::as_str) == Some("always") {
                    break;
                }
            }
            next.insert(name.as_str(), targets);
        }
        let mut graph = StateGraph {
            next,
            reachable: BTreeSet::new(),
            after: BTreeMap::new(),
            terminal,
            dangling,
        };
        let after: BTreeMap<&'a str, BTreeSet<&'a str>> = graph
            .next
            .keys()
            .map(|name| (*name, graph.successors(name)))
            .collect();
        graph.after = after;
        if let Some(initial) = initial.and_then(|i| states.get_key_value(i)) {
            let initial = initial.0.as_str();
            let mut reachable = graph.after.get(initial).cloned().unwrap_or_default();
            reachable.insert(initial);
            graph.reachable = reachable;
        }
        graph
    }

    /// States reachable from `from` in one or more steps.
    fn successors(&self, from: &str) -> BTreeSet<&'a str> {
        let mut seen = BTreeSet::new();
        let mut queue: VecDeque<&'a str> =
            self.next.get(from).into_iter().flatten().copied().collect();
        while let Some(name) = queue.pop_front() {
            if seen.insert(name) {
                queue.extend(self.next.get(name).into_iter().flatten().copied());
            }
        }
        seen
    }

    /// Whether a run can reach `state` (false for everything when the initial state is unknown).
    pub(crate) fn is_reachable(&self, state: &str) -> bool {
        self.reachable.contains(state)
    }

    /// Whether `earlier` can have run before `later` in some run: a run reaches `earlier` and
    /// can go on from it to `later`. For `earlier == later` this means `later` lies on a loop,
    /// so its previous visit's output exists on a revisit.
    pub(crate) fn can_run_before(&self, earlier: &str, later: &str) -> bool {
        self.is_reachable(earlier)
            && self
                .after
                .get(earlier)
                .is_some_and(|after| after.contains(later))
    }

    /// The reachable loops (strongly connected sets of states) that no run can leave: no
    /// terminal state is reachable from them. Each loop's states in name order.
    pub(crate) fn inescapable_loops(&self) -> Vec<Vec<&'a str>> {
        let mut loops = Vec::new();
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for name in &self.reachable {
            let Some(after) = self.after.get(name) else {
                continue;
            };
            if done.contains(name) || !after.contains(name) {
                continue;
            }
            let members: Vec<&'a str> = after
                .iter()
                .copied()
                .filter(|other| self.can_run_before(other, name))
                .collect();
            done.extend(members.iter().copied());
            let way_out = after
                .iter()
                .any(|s| self.terminal.contains(s) || self.dangling.contains(s));
            if !way_out {
                loops.push(members);
            }
        }
        loops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn states(pairs: &[(&str, &[(&str, &str)])]) -> Map<String, Value> {
        pairs
            .iter()
            .map(|(name, transitions)| {
                let transitions: Vec<Value> = transitions
                    .iter()
                    .map(|(condition, target)| json!({"condition": condition, "target": target}))
                    .collect();
                (name.to_string(), json!({"transitions": transitions}))
            })
            .collect()
    }

    #[test]
    fn orders_states_and_finds_loops_without_exit() {
        let s = states(&[
            ("write", &[("on_success", "review")]),
            (
                "review",
                &[
                    ("score_above", "done"),
                    ("always", "write"),
                    ("on_failure", "x"),
                ],
            ),
            ("done", &[]),
        ]);
        let g = StateGraph::new(&s, Some("write"));
        assert!(g.can_run_before("write", "review"));
        assert!(
            g.can_run_before("review", "write"),
            "revisited through the loop"
        );
        assert!(g.can_run_before("write", "write"));
        assert!(!g.can_run_before("done", "write"));
        assert!(
            g.inescapable_loops().is_empty(),
            "the refine loop has an exit"
        );

        let s = states(&[
            ("start", &[("always", "a")]),
            ("a", &[("on_success", "b"), ("on_failure", "a")]),
            ("b", &[("always", "a"), ("on_failure", "done")]),
            ("done", &[]),
        ]);
        let g = StateGraph::new(&s, Some("start"));
        assert_eq!(g.inescapable_loops(), vec![vec!["a", "b"]]);
        assert!(!g.can_run_before("start", "start"));
        assert!(
            !g.is_reachable("done"),
            "only a dead transition leads there"
        );
    }
}
