//! Whom one purge is for: the subject and its aliases, by key while Lethe knows them, or only by
//! reference once their erasure completed (a replay after a restore). A store that names owners
//! by key is then searched for candidates, and a candidate is one of them when its reference is.

use std::collections::BTreeSet;
use std::sync::Arc;

use lethe_policy::audit::{FORGOTTEN, forgotten, subject_ref};

#[derive(Debug, Clone)]
pub struct Subjects {
    tenant: String,
    /// Keys, or forgotten names (`ref/<reference>`).
    names: Vec<String>,
    audit_key: Arc<[u8]>,
}

impl Subjects {
    pub fn new(tenant: &str, names: Vec<String>, audit_key: Arc<[u8]>) -> Subjects {
        Subjects {
            tenant: tenant.to_owned(),
            names,
            audit_key,
        }
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The names lineage knows the subjects by (their keys, or their forgotten names).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The keys a store can be searched by; none for a subject known only by reference.
    pub fn keys(&self) -> Vec<String> {
        self.names
            .iter()
            .filter(|n| !n.starts_with(FORGOTTEN))
            .cloned()
            .collect()
    }

    /// The reference of every subject (`lethe_policy::audit::subject_ref`): what stores that
    /// keep owners pseudonymised (trace stores) are searched by, whether or not the key is known.
    pub fn references(&self) -> Vec<String> {
        self.names
            .iter()
            .map(|n| subject_ref(&self.audit_key, &self.tenant, n))
            .collect()
    }

    /// Whether some subject is known only by reference: then its key must be found again in the
    /// store, among the owners it names.
    pub fn any_forgotten(&self) -> bool {
        self.names.iter().any(|n| n.starts_with(FORGOTTEN))
    }

    /// The verification probes' texts: each of `templates` (`[erasure] probes`) built from each
    /// of the subjects' keys (`{subject}`) and the tenant (`{tenant}`).
    pub fn probes(&self, templates: &[String]) -> Vec<String> {
        self.keys()
            .iter()
            .flat_map(|key| {
                templates.iter().map(move |t| {
                    t.replace("{subject}", key)
                        .replace("{tenant}", &self.tenant)
                })
            })
            .collect()
    }

    /// Whether `owner`, a subject key a store holds in this tenant, is one of these subjects.
    pub fn include(&self, owner: &str) -> bool {
        self.names
            .iter()
            .any(|n| n == owner || *n == forgotten(&self.audit_key, &self.tenant, owner))
    }

    /// These subjects, with the keys of those known only by reference added where `candidates`
    /// (owners the store names) hold them: then the store can be searched by key again.
    pub fn found_among<'a>(&self, candidates: impl IntoIterator<Item = &'a str>) -> Subjects {
        let mut names: BTreeSet<String> = self.names.iter().cloned().collect();
        names.extend(
            candidates
                .into_iter()
                .filter(|c| !c.starts_with(FORGOTTEN) && self.include(c))
                .map(str::to_owned),
        );
        Subjects {
            names: names.into_iter().collect(),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subjects(names: &[&str]) -> Subjects {
        Subjects::new(
            "acme",
            names.iter().map(|n| (*n).to_owned()).collect(),
            Arc::from(&b"k"[..]),
        )
    }

    #[test]
    fn a_forgotten_subject_is_recognised_by_its_reference_only() {
        let name = forgotten(b"k", "acme", "u1");
        let s = subjects(&[&name, "u2"]);
        assert_eq!(s.keys(), vec!["u2".to_owned()]);
        assert!(s.any_forgotten());
        assert!(s.include("u1") && s.include("u2"));
        assert!(!s.include("u3"));
        // The same key in another tenant is another subject.
        let other = Subjects::new("globex", vec![name.clone()], Arc::from(&b"k"[..]));
        assert!(!other.include("u1"));
        let found = s.found_among(["u3", "u1", &name]);
        assert_eq!(found.keys(), vec!["u1".to_owned(), "u2".to_owned()]);
        assert!(found.include("u1") && !found.include("u3"));
        // A forgotten name and its key have one reference.
        assert_eq!(s.references()[0], subject_ref(b"k", "acme", "u1"));
        assert_eq!(found.references()[0], found.references()[1]);
    }

    #[test]
    fn known_keys_are_searched_as_they_are() {
        let s = subjects(&["u1"]);
        assert!(!s.any_forgotten());
        assert_eq!(s.keys(), vec!["u1".to_owned()]);
        assert_eq!(s.found_among(["u2"]).keys(), vec!["u1".to_owned()]);
    }

    #[test]
    fn probes_are_built_from_every_key_known_and_the_tenant() {
        let s = subjects(&[&forgotten(b"k", "acme", "u0"), "u1", "u1@mail"]);
        let templates = [
            "{subject}".to_owned(),
            "user {subject} of {tenant}".to_owned(),
        ];
        assert_eq!(
            s.probes(&templates),
            ["u1", "user u1 of acme", "u1@mail", "user u1@mail of acme"],
            "a forgotten subject's key is no longer known: nothing is built from it"
        );
    }
}
