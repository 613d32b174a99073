//! What a caller may read, as a filter Azure applies: for what it computes over many documents
//! (`@odata.count`, `@search.facets`, autocomplete's terms), which cannot be decided document by
//! document once computed. The filter is built from the policy of the subjects in the caller's
//! scope and says what [`decide_read_item`](lethe_policy::decide_read_item) says of each
//! document: its subject is not under erasure, it is of the epoch the subject is in now and of a
//! layer Lethe knows, its purpose and category are covered for retrieval by the subject's
//! consent now, and no erasure's closure hides it. The caller's scope (tenant, bound subject,
//! purpose, deadline) is the narrowed filter it is ANDed with. One search then computes over
//! exactly what the caller may see, whatever the size of the scope.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use lethe_policy::{Action, Layer, PolicyView};

use super::super::odata::{Expr, Function, Literal, Op, Operand, Path};
use super::{SUBJECT, canonical_key};
use crate::kit::stamp::{CATEGORY, EPOCH, LAYER, PURPOSE};

/// The most subjects a scope's filter names: past it, a read over documents by a caller bound
/// to no subject is refused (bind one, or narrow the filter).
pub const MAX_SUBJECTS: usize = 10_000;

/// The facet a request asks Azure for to learn which subjects a scope holds (one more than
/// [`MAX_SUBJECTS`], to tell "every one" from "too many"; Azure answers 10 by default).
pub fn subjects_facet() -> String {
    format!("{SUBJECT},count:{}", MAX_SUBJECTS + 1)
}

/// What decides a subject's documents: the epoch it is in, and the purposes and categories its
/// consent covers for retrieval.
type Conditions<'a> = (i64, Vec<(&'a str, &'a str)>);

/// The filter of the documents of `subjects` (in `tenant`) the caller may read at `now`, less
/// those under the `hidden` keys (an erasure's closure) in `key_field`.
pub fn readable(
    tenant: &str,
    subjects: &[String],
    view: &impl PolicyView,
    key_field: &str,
    hidden: &[String],
    now: DateTime<Utc>,
) -> Expr {
    // Subjects whose documents the same conditions decide share one clause.
    let mut alike: BTreeMap<Conditions<'_>, Vec<&str>> = BTreeMap::new();
    for subject in subjects {
        let Some(policy) = view.subject(tenant, subject) else {
            continue; // never heard of: no consent
        };
        if !policy.state.is_active() {
            continue;
        }
        let mut covered: Vec<(&str, &str)> = policy
            .grants
            .iter()
            .filter(|g| g.covers(&g.purpose, &g.category, Action::Retrieve, now))
            .map(|g| (g.purpose.as_str(), g.category.as_str()))
            .collect();
        covered.sort_unstable();
        covered.dedup();
        if !covered.is_empty() {
            alike
                .entry((policy.state.epoch, covered))
                .or_default()
                .push(subject);
        }
    }
    let clauses = alike.into_iter().map(|((epoch, covered), subjects)| {
        let uses = covered.iter().map(|(purpose, category)| {
            and(is(PURPOSE, text(purpose)), is(CATEGORY, text(category)))
        });
        and(
            one_of(SUBJECT, &subjects),
            and(
                is(EPOCH, Literal::Number(epoch.to_string())),
                any_of(uses.collect()),
            ),
        )
    });
    let mut filter = and(any_of(clauses.collect()), known_layer());
    let hidden: Vec<&str> = hidden
        .iter()
        .map(String::as_str)
        .filter(|key| canonical_key(key))
        .collect();
    if !hidden.is_empty() {
        filter = and(filter, Expr::Not(Box::new(one_of(key_field, &hidden))));
    }
    filter
}

/// A layer Lethe reads (none written is raw).
fn known_layer() -> Expr {
    let layers: Vec<&str> = [Layer::Raw, Layer::Derived, Layer::Cache]
        .iter()
        .map(|l| l.as_str())
        .collect();
    Expr::Or(
        Box::new(is(LAYER, Literal::Null)),
        Box::new(one_of(LAYER, &layers)),
    )
}

fn field(name: &str) -> Operand {
    Operand::Field(Path(vec![name.to_owned()]))
}

fn text(value: &str) -> Literal {
    Literal::Str(value.to_owned())
}

fn is(name: &str, value: Literal) -> Expr {
    Expr::Compare(field(name), Op::Eq, Operand::Literal(value))
}

fn and(a: Expr, b: Expr) -> Expr {
    Expr::And(Box::new(a), Box::new(b))
}

/// `name` is one of `values`: `search.in` over those a comma list can carry exactly, `eq` for
/// the rest.
fn one_of(name: &str, values: &[&str]) -> Expr {
    let listable = |v: &&str| !v.is_empty() && !v.contains(',') && v.trim() == *v;
    let (listed, apart): (Vec<&str>, Vec<&str>) = values.iter().copied().partition(listable);
    let mut clauses: Vec<Expr> = apart.into_iter().map(|v| is(name, text(v))).collect();
    if !listed.is_empty() {
        clauses.push(Expr::Call(
            Function::SearchIn,
            vec![
                field(name),
                Operand::Literal(text(&listed.join(","))),
                Operand::Literal(text(",")),
            ],
        ));
    }
    any_of(clauses)
}

/// Any of `clauses` (none: false), as a balanced tree: its depth grows with the logarithm of
/// their number, and so does the stack that writes it.
fn any_of(mut clauses: Vec<Expr>) -> Expr {
    match clauses.len() {
        0 => Expr::Operand(Operand::Literal(Literal::Bool(false))),
        1 => clauses.remove(0),
        n => {
            let right = clauses.split_off(n / 2);
            Expr::Or(Box::new(any_of(clauses)), Box::new(any_of(right)))
        }
    }
}

#[cfg(test)]
mod tests;
