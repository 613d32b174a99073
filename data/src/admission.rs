//! Who may open a connection to a listener: at most `max_connections` at once, and at most
//! `max_connections_per_address` from one address, so that no client (logged in or not) takes
//! every connection, or the memory each holds, from the others. A connection refused is told
//! why in its own protocol and closed before anything of it is read.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_address: usize,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the listener serves as many connections as it may")]
    Full,
    #[error("this address holds as many connections as one address may")]
    AddressFull,
}

/// The connections open on one listener.
#[derive(Debug)]
pub struct Gate {
    limits: ConnectionLimits,
    /// How many are open, in all and by address.
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// An admitted connection's place; given back when it is dropped.
#[derive(Debug)]
pub struct Admission {
    gate: Arc<Gate>,
    address: IpAddr,
}

impl Gate {
    pub fn new(limits: ConnectionLimits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A place for a connection from `address`, if the listener has one for it.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Admission, Refused> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let (all, by_address) = &mut *open;
        if *all >= self.limits.max_connections {
            return Err(Refused::Full);
        }
        let mine = by_address.entry(address).or_insert(0);
        if *mine >= self.limits.max_connections_per_address {
            return Err(Refused::AddressFull);
        }
        *mine += 1;
        *all += 1;
        Ok(Admission {
            gate: Arc::clone(self),
            address,
        })
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

impl crate::metrics::OpenConnections for Gate {
    fn open(&self) -> usize {
        Gate::open(self)
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|p| p.into_inner());
        let (all, by_address) = &mut *open;
        *all = all.saturating_sub(1);
        if let Some(mine) = by_address.get_mut(&self.address) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                // An address with nothing open is forgotten: the map holds open connections only.
                by_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(all: usize, per_address: usize) -> Arc<Gate> {
        Gate::new(ConnectionLimits {
            max_connections: all,
            max_connections_per_address: per_address,
        })
    }

    #[test]
    fn one_address_takes_its_share_and_no_more() {
        let gate = gate(10, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = gate.admit(a).unwrap();
        let _second = gate.admit(a).unwrap();
        assert_eq!(gate.admit(a).err(), Some(Refused::AddressFull));
        assert!(gate.admit(b).is_ok(), "another address still gets in");
        drop(first);
        assert!(
            gate.admit(a).is_ok(),
            "a closed connection gives its place back"
        );
    }

    #[test]
    fn the_listener_takes_its_maximum_and_forgets_closed_addresses() {
        let gate = gate(3, 3);
        let held: Vec<Admission> = (1..=3)
            .map(|i| gate.admit(IpAddr::from([10, 0, 0, i])).unwrap())
            .collect();
        assert_eq!(
            gate.admit("10.0.0.9".parse().unwrap()).err(),
            Some(Refused::Full)
        );
        assert_eq!(gate.open(), 3);
        drop(held);
        assert_eq!(gate.open(), 0);
        assert!(gate.open.lock().unwrap().1.is_empty());
    }
}
