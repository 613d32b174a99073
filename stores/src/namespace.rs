//! Per-tenant namespaces (`isolation = "collection_per_tenant"`), for stores whose collections
//! several tenants' agents would otherwise share: a collection's size, its name and whether an id
//! exists in it are the store's to answer, not Lethe's to filter, so with a namespace each tenant
//! has collections of its own, under names no other tenant can reach or learn. A client names
//! its collections as it always does; Lethe sends the store the physical name
//! (`lethe_<32 hex digits of the tenant's hash>__<name>`) and turns it back in what the store
//! answers. Pure: no I/O.

use sha2::{Digest, Sha256};

/// The longest physical name a store takes (Qdrant's, and the file names its collections become).
const MAX_PHYSICAL: usize = 255;

/// One tenant's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    prefix: String,
}

impl Namespace {
    /// The namespace of `tenant`: the hash needs no key, since no other tenant ever sees it.
    pub fn of(tenant: &str) -> Namespace {
        let mut hash = Sha256::new();
        hash.update(b"lethe-namespace\0");
        hash.update(tenant.as_bytes());
        let digest = hex::encode(hash.finalize());
        Namespace {
            prefix: format!("lethe_{}__", digest.get(..32).unwrap_or(&digest)),
        }
    }

    /// The name the store keeps `logical` under, or `None` when it would be too long.
    pub fn physical(&self, logical: &str) -> Option<String> {
        let name = format!("{}{logical}", self.prefix);
        (name.len() <= MAX_PHYSICAL).then_some(name)
    }

    /// The name a client knows a physical name by; `None` for a name outside this namespace
    /// (another tenant's, or one made around Lethe).
    pub fn logical<'a>(&self, physical: &'a str) -> Option<&'a str> {
        physical
            .strip_prefix(&self.prefix)
            .filter(|rest| !rest.is_empty())
    }

    /// A text of the store's (an error message) with this namespace's physical names turned back
    /// into the client's.
    pub fn scrub(&self, text: &str) -> String {
        text.replace(&self.prefix, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_go_there_and_back_and_never_into_another_namespace() {
        let (acme, globex) = (Namespace::of("acme"), Namespace::of("globex"));
        let memories = acme.physical("memories").unwrap();
        assert!(memories.starts_with("lethe_") && memories.ends_with("__memories"));
        assert_eq!(memories.len(), "lethe_".len() + 32 + 2 + "memories".len());
        assert_eq!(acme.logical(&memories), Some("memories"));
        assert_eq!(globex.logical(&memories), None, "another tenant's");
        assert_eq!(acme.logical("memories"), None, "made around Lethe");
        assert_eq!(acme.logical(&acme.physical("").unwrap()), None);
        // A client naming another namespace's physical name stays in its own.
        let forged = globex.physical(&memories).unwrap();
        assert_eq!(globex.logical(&forged), Some(memories.as_str()));
        assert_eq!(acme.logical(&forged), None);
        assert!(acme.physical(&"x".repeat(215)).is_some());
        assert!(acme.physical(&"x".repeat(216)).is_none());
        assert_eq!(
            acme.scrub(&format!("Collection `{memories}` doesn't exist!")),
            "Collection `memories` doesn't exist!"
        );
    }

    proptest! {
        #[test]
        fn two_tenants_never_share_a_physical_name(a in "\\PC{1,12}", b in "\\PC{1,12}", name in "[a-z0-9_.-]{1,20}") {
            prop_assume!(a != b);
            let (na, nb) = (Namespace::of(&a), Namespace::of(&b));
            let pa = na.physical(&name).unwrap();
            prop_assert_ne!(&pa, &nb.physical(&name).unwrap());
            prop_assert_eq!(nb.logical(&pa), None);
        }
    }
}
