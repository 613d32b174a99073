//! What each Redis command a client sends is, to Lethe: which of its arguments are keys, what it
//! does to them, and what a key Lethe hides reads as. A command not listed here is refused: a
//! new command of a new Redis reaches no key until it is classified. Pure: no I/O.

/// What a hidden key (its subject suppressed or erased, or without `retrieve` consent) reads
/// as: what Redis answers for a key that does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    Nil,
    Zero,
    EmptyArray,
    /// `HGETALL`: an empty map (an empty array in RESP2).
    EmptyMap,
    /// `SMEMBERS`: an empty set (an empty array in RESP2).
    EmptySet,
    EmptyBulk,
    /// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`: -2.
    MinusTwo,
    /// `TYPE`: `none`.
    NoneType,
    /// `HSCAN`, `SSCAN`, `ZSCAN`: the end of an empty scan.
    EmptyScan,
    /// `HMGET`, `ZMSCORE`: a nil for each field asked.
    NilPerField,
    /// `SMISMEMBER`: a 0 for each member asked.
    ZeroPerMember,
}

/// How a command combines sets: what a missing (or hidden) key does to its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// It adds nothing: left out.
    Union,
    /// The answer is empty.
    Inter,
    /// The first empties the answer; any other is left out.
    Diff,
    /// `SINTERCARD`, `ZINTERCARD`: the count is 0.
    InterCard,
}

/// What a command does to the keys it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads its keys.
    Read(Missing),
    /// `MGET`: a nil in the place of each hidden key.
    ReadEach,
    /// `EXISTS`, `TOUCH`: counts the keys it is allowed to see.
    Count,
    /// Writes its keys; each carries the deadline Lethe computes.
    Write,
    /// Sets or removes its key's expiry; clamped to the deadline.
    Expire,
    /// Removes its keys.
    Delete,
    /// Combines the sets or sorted sets it names (`SUNION`, `ZINTER`, `SINTERCARD`, ...): a
    /// hidden key counts as a missing one, an empty set.
    Combine(Combine),
    /// Takes an element from one of its keys, waiting for one (`BLPOP`): decided like a
    /// write that answers stored data, and sent alone (a transaction would not wait).
    Take,
}

/// Where a command's keys are among its arguments (the name is argument 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keys {
    First,
    /// Every argument (`DEL a b c`).
    All,
    /// Every other argument from the first (`MSET k v k v`).
    Pairs,
    /// The first two (`COPY src dst`, `LMOVE src dst ...`).
    FirstTwo,
    /// Every argument but the last (`BLPOP a b timeout`).
    AllButLast,
    /// As many as the first argument says, after it (`ZUNION 2 a b ...`).
    Counted,
    /// A destination, then every key it is made from (`SUNIONSTORE dst a b`).
    Into,
    /// A destination, then as many as the argument after it says (`ZUNIONSTORE dst 2 a b`).
    IntoCounted,
    /// A destination and the one key it is made from (`ZRANGESTORE dst src 0 -1`).
    IntoOne,
    /// The first half of the arguments after `STREAMS` (`XREAD ... STREAMS a b id-a id-b`).
    Streams,
}

impl Keys {
    /// Whether the command writes one key from the data of the others: then they must all be
    /// one subject's, for no subject's data may land in another's key.
    pub fn moves_data(self) -> bool {
        matches!(
            self,
            Keys::FirstTwo | Keys::Into | Keys::IntoCounted | Keys::IntoOne
        )
    }

    /// The places, among its `count` keys, of those a write writes.
    pub fn written(self, count: usize) -> Vec<usize> {
        match self {
            Keys::FirstTwo => vec![1],
            Keys::Into | Keys::IntoCounted | Keys::IntoOne => vec![0],
            _ => (0..count).collect(),
        }
    }
}

/// A command, classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Keyed(Effect, Keys),
    Scan,
    Auth,
    Hello,
    Ping,
    Echo,
    Quit,
    Select,
    /// `CLIENT SETNAME`, `CLIENT SETINFO`: a client's name for itself, answered `OK`.
    ClientName,
    Multi,
    Exec,
    Discard,
    Watch,
    Unwatch,
    /// `SUBSCRIBE`, `SSUBSCRIBE`: channels named like keys, each of the caller's scope.
    Subscribe,
    /// `UNSUBSCRIBE`, `SUNSUBSCRIBE`.
    Unsubscribe,
    /// `PUBLISH`, `SPUBLISH`: a message on a channel, decided like a write of its subject.
    Publish,
    /// A command on the server itself that reads no key and answers no stored data (`INFO`,
    /// `DBSIZE`, `TIME`, ...): served to admin tokens only.
    Server,
    /// Refused outright, with why.
    Refused(&'static str),
    /// Not a command Lethe serves.
    Unknown,
}

/// The command `args` make (`args[0]` is its name, in any case).
/// A command's name in capitals, made without allocating (every command is looked up several
/// times on the hot path); a name longer than any command's is empty.
struct Name {
    bytes: [u8; 24],
    len: usize,
}

impl Name {
    fn of(args: &[Vec<u8>]) -> Name {
        let mut name = Name {
            bytes: [0; 24],
            len: 0,
        };
        if let Some(given) = args.first().filter(|n| n.len() <= name.bytes.len()) {
            name.bytes[..given.len()].copy_from_slice(given);
            name.bytes[..given.len()].make_ascii_uppercase();
            name.len = given.len();
        }
        name
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// The name, or empty when it is not text (then it is no command).
    fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_slice()).unwrap_or_default()
    }
}

pub fn classify(args: &[Vec<u8>]) -> Command {
    let name = Name::of(args);
    let name = name.as_str();
    keyed(name, args).unwrap_or_else(|| unkeyed(name, args))
}

/// A command on keys: what it does to them and where its keys are; `None` for any other.
fn keyed(name: &str, args: &[Vec<u8>]) -> Option<Command> {
    use Effect::*;
    use Keys::*;
    use Missing::*;
    let keyed = |effect, keys| Command::Keyed(effect, keys);
    Some(match name {
        "GET" | "LINDEX" | "HGET" | "ZSCORE" | "ZRANK" | "ZREVRANK" => keyed(Read(Nil), First),
        "GETRANGE" => keyed(Read(EmptyBulk), First),
        // With a count they answer a list: an empty one for a missing key.
        "SRANDMEMBER" | "HRANDFIELD" => {
            keyed(Read(if args.len() >= 3 { EmptyArray } else { Nil }), First)
        }
        "LPOS" => {
            let counted = args
                .iter()
                .skip(3)
                .any(|a| a.eq_ignore_ascii_case(b"COUNT"));
            keyed(Read(if counted { EmptyArray } else { Nil }), First)
        }
        "STRLEN" | "HLEN" | "HEXISTS" | "HSTRLEN" | "LLEN" | "SCARD" | "SISMEMBER" | "ZCARD"
        | "ZCOUNT" | "ZLEXCOUNT" | "XLEN" => keyed(Read(Zero), First),
        "HGETALL" => keyed(Read(EmptyMap), First),
        "SMEMBERS" => keyed(Read(EmptySet), First),
        "HKEYS" | "HVALS" | "LRANGE" | "ZRANGE" | "ZRANGEBYSCORE" | "ZREVRANGE"
        | "ZREVRANGEBYSCORE" | "ZRANGEBYLEX" | "ZREVRANGEBYLEX" | "XRANGE" | "XREVRANGE" => {
            keyed(Read(EmptyArray), First)
        }
        "TTL" | "PTTL" | "EXPIRETIME" | "PEXPIRETIME" => keyed(Read(MinusTwo), First),
        "TYPE" => keyed(Read(NoneType), First),
        "HSCAN" | "SSCAN" | "ZSCAN" => keyed(Read(EmptyScan), First),
        "HMGET" | "ZMSCORE" => keyed(Read(NilPerField), First),
        "SMISMEMBER" => keyed(Read(ZeroPerMember), First),
        "MGET" => keyed(ReadEach, All),
        "EXISTS" | "TOUCH" => keyed(Count, All),
        "SET" | "SETNX" | "SETEX" | "PSETEX" | "GETSET" | "APPEND" | "INCR" | "INCRBY"
        | "INCRBYFLOAT" | "DECR" | "DECRBY" | "SETRANGE" | "HSET" | "HSETNX" | "HMSET" | "HDEL"
        | "HINCRBY" | "HINCRBYFLOAT" | "LPUSH" | "RPUSH" | "LPUSHX" | "RPUSHX" | "LPOP"
        | "RPOP" | "LSET" | "LREM" | "LTRIM" | "LINSERT" | "SADD" | "SREM" | "SPOP" | "ZADD"
        | "ZREM" | "ZINCRBY" | "ZPOPMIN" | "ZPOPMAX" | "ZREMRANGEBYSCORE" | "ZREMRANGEBYRANK"
        | "ZREMRANGEBYLEX" | "XADD" | "XDEL" | "XTRIM" => keyed(Write, First),
        "MSET" | "MSETNX" => keyed(Write, Pairs),
        "BLPOP" | "BRPOP" | "BZPOPMIN" | "BZPOPMAX" => keyed(Take, AllButLast),
        "SUNION" => keyed(Combine(self::Combine::Union), All),
        "SINTER" => keyed(Combine(self::Combine::Inter), All),
        "SDIFF" => keyed(Combine(self::Combine::Diff), All),
        "ZUNION" => keyed(Combine(self::Combine::Union), Counted),
        "ZINTER" => keyed(Combine(self::Combine::Inter), Counted),
        "ZDIFF" => keyed(Combine(self::Combine::Diff), Counted),
        "SINTERCARD" | "ZINTERCARD" => keyed(Combine(self::Combine::InterCard), Counted),
        "SUNIONSTORE" | "SINTERSTORE" | "SDIFFSTORE" => keyed(Write, Into),
        "ZUNIONSTORE" | "ZINTERSTORE" | "ZDIFFSTORE" => keyed(Write, IntoCounted),
        "ZRANGESTORE" => keyed(Write, IntoOne),
        "XREAD" => keyed(Read(Nil), Streams),
        "BLMOVE" | "BRPOPLPUSH" => Command::Refused(
            "the key it moves an element into needs its deadline in the same transaction, and a transaction does not wait; use LMOVE",
        ),
        "BLMPOP" | "BZMPOP" => Command::Refused("use BLPOP, BRPOP, BZPOPMIN or BZPOPMAX"),
        // Its options follow the two keys: `DB` would write into a database the route does not
        // serve, and the purge would have to find the copy there.
        "COPY" if args.iter().skip(3).any(|a| a.eq_ignore_ascii_case(b"DB")) => Command::Refused(
            "the route's database is set by its upstream URL; COPY into another database is not served",
        ),
        "COPY" | "RENAME" | "RENAMENX" | "LMOVE" | "RPOPLPUSH" | "SMOVE" => keyed(Write, FirstTwo),
        "GETEX" | "GETDEL" => keyed(if name == "GETDEL" { Delete } else { Expire }, First),
        "EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT" | "PERSIST" => keyed(Expire, First),
        "DEL" | "UNLINK" => keyed(Delete, All),
        _ => return None,
    })
}

/// A command that names no key: the connection's, the server's, Pub/Sub's, or one refused.
fn unkeyed(name: &str, args: &[Vec<u8>]) -> Command {
    match name {
        "SCAN" => Command::Scan,
        "AUTH" => Command::Auth,
        "HELLO" => Command::Hello,
        "PING" => Command::Ping,
        "ECHO" => Command::Echo,
        "QUIT" => Command::Quit,
        "SELECT" => Command::Select,
        "MULTI" => Command::Multi,
        "EXEC" => Command::Exec,
        "DISCARD" => Command::Discard,
        "WATCH" => Command::Watch,
        "UNWATCH" => Command::Unwatch,
        "CLIENT" => {
            let sub = args
                .get(1)
                .map(|s| s.to_ascii_uppercase())
                .unwrap_or_default();
            match sub.as_slice() {
                b"SETNAME" | b"SETINFO" => Command::ClientName,
                _ => Command::Refused("CLIENT reaches other clients' connections"),
            }
        }
        "KEYS" => Command::Refused("KEYS blocks Redis while it walks every key; use SCAN"),
        "FLUSHALL" | "FLUSHDB" | "SWAPDB" | "MOVE" => {
            Command::Refused("it reaches every tenant's keys")
        }
        "RANDOMKEY" | "SORT" | "SORT_RO" => {
            Command::Refused("its answer names or counts other tenants' keys")
        }
        "EVAL" | "EVALSHA" | "EVAL_RO" | "EVALSHA_RO" | "FCALL" | "FCALL_RO" | "SCRIPT"
        | "FUNCTION" => Command::Refused("a script can reach any key"),
        "DUMP" | "RESTORE" | "MIGRATE" | "OBJECT" => {
            Command::Refused("it moves keys past their stamp and deadline")
        }
        "INFO" | "DBSIZE" | "TIME" | "LASTSAVE" => Command::Server,
        "COMMAND" | "MEMORY" | "LATENCY" => {
            let sub = args
                .get(1)
                .map(|s| s.to_ascii_uppercase())
                .unwrap_or_default();
            match (name, sub.as_slice()) {
                ("COMMAND", b"" | b"COUNT" | b"INFO" | b"DOCS" | b"LIST" | b"GETKEYS")
                | ("MEMORY", b"STATS" | b"DOCTOR" | b"MALLOC-STATS")
                | ("LATENCY", b"LATEST" | b"HISTORY" | b"DOCTOR" | b"HISTOGRAM") => Command::Server,
                _ => Command::Refused("it administers the server, not one subject's keys"),
            }
        }
        "CONFIG" | "DEBUG" | "MONITOR" | "SHUTDOWN" | "SAVE" | "BGSAVE" | "BGREWRITEAOF"
        | "REPLICAOF" | "SLAVEOF" | "MODULE" | "ACL" | "WAIT" | "WAITAOF" | "FAILOVER"
        | "SLOWLOG" | "CLUSTER" | "READONLY" | "READWRITE" | "RESET" | "SYNC" | "PSYNC" => {
            Command::Refused("it administers the server, not one subject's keys")
        }
        "SUBSCRIBE" | "SSUBSCRIBE" => Command::Subscribe,
        "UNSUBSCRIBE" | "SUNSUBSCRIBE" => Command::Unsubscribe,
        "PUBLISH" | "SPUBLISH" => Command::Publish,
        "PSUBSCRIBE" | "PUNSUBSCRIBE" => Command::Refused(
            "a channel pattern can match other subjects' channels; SUBSCRIBE to each",
        ),
        "PUBSUB" => Command::Refused("its answer names or counts other tenants' channels"),
        _ => Command::Unknown,
    }
}

/// How long a command may wait in Redis for data (`BLPOP ... timeout`, `XREAD BLOCK ms`):
/// `None` for a command that does not wait, `Some(None)` for one that may wait for ever.
pub fn waits(args: &[Vec<u8>]) -> Result<Option<Option<std::time::Duration>>, String> {
    let name = Name::of(args);
    let text = |a: &Vec<u8>| String::from_utf8_lossy(a).into_owned();
    let (limit, unit) = match name.as_slice() {
        b"BLPOP" | b"BRPOP" | b"BZPOPMIN" | b"BZPOPMAX" => match args.last() {
            Some(limit) if args.len() >= 3 => (text(limit), 1.0),
            _ => return Ok(None),
        },
        b"XREAD" => {
            let block = args.iter().position(|a| a.eq_ignore_ascii_case(b"BLOCK"));
            match block.and_then(|at| args.get(at + 1)) {
                Some(limit) => (text(limit), 0.001),
                None => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    match limit.parse::<f64>() {
        Ok(0.0) => Ok(Some(None)),
        Ok(limit) if limit > 0.0 && limit.is_finite() => Ok(Some(Some(
            std::time::Duration::from_secs_f64((limit * unit).min(1e9)),
        ))),
        _ => Err("timeout is not a positive number".to_owned()),
    }
}

/// Whether a command that writes (or deletes, or sets a deadline) tells something of what was
/// stored: then it reads too, and needs what a read needs (a caller that may store but not
/// retrieve would read through it). Every write's answer does (a popped element, the value
/// replaced, a score, a length, a count, whether a member, a field or the key was there, a type
/// in `WRONGTYPE`, an order in an error) but those of an allow-list, which replace what a key
/// held whatever it was and answer `OK`: `SET` without `NX`, `XX` or `GET`, `SETEX`, `PSETEX`
/// and `MSET`.
pub fn reveals(args: &[Vec<u8>]) -> bool {
    let name = Name::of(args);
    let answers_nothing = match name.as_slice() {
        b"SET" => only_deadline_options(args.get(3..).unwrap_or_default()),
        b"SETEX" | b"PSETEX" | b"MSET" => true,
        _ => false,
    };
    !answers_nothing
}

/// Whether `SET`'s options only set the key's deadline (`EX`, `PX`, `EXAT`, `PXAT` with their
/// number, `KEEPTTL`): an allow-list, for every other option makes the answer tell something
/// (`NX`, `XX`, `GET`, and the conditions newer servers take, `IFEQ`, `IFNE`, `IFDEQ`, ...).
fn only_deadline_options(options: &[Vec<u8>]) -> bool {
    let mut options = options.iter();
    while let Some(option) = options.next() {
        let is = |name: &[u8]| option.eq_ignore_ascii_case(name);
        if is(b"EX") || is(b"PX") || is(b"EXAT") || is(b"PXAT") {
            if options.next().is_none() {
                return false;
            }
        } else if !is(b"KEEPTTL") {
            return false;
        }
    }
    true
}

/// The positions of a command's keys among `args`, or why the command is malformed.
pub fn key_positions(keys: Keys, args: &[Vec<u8>]) -> Result<Vec<usize>, String> {
    let n = args.len();
    let positions: Vec<usize> = match keys {
        Keys::First if n >= 2 => vec![1],
        Keys::All => (1..n).collect(),
        Keys::Pairs if n % 2 == 1 => (1..n).step_by(2).collect(),
        Keys::Pairs => Vec::new(),
        Keys::FirstTwo if n >= 3 => vec![1, 2],
        Keys::First | Keys::FirstTwo => Vec::new(),
        Keys::AllButLast => (1..n.saturating_sub(1)).collect(),
        Keys::Into if n >= 3 => (1..n).collect(),
        Keys::IntoOne if n >= 3 => vec![1, 2],
        Keys::Into | Keys::IntoOne => Vec::new(),
        Keys::Counted | Keys::IntoCounted => {
            let at = if keys == Keys::Counted { 1 } else { 2 };
            let count = args
                .get(at)
                .and_then(|c| std::str::from_utf8(c).ok()?.parse::<usize>().ok())
                .filter(|&c| c >= 1 && at + c < n);
            match count {
                Some(count) => (1..at).chain(at + 1..=at + count).collect(),
                None => Vec::new(),
            }
        }
        Keys::Streams => {
            let streams = args
                .iter()
                .position(|a| a.eq_ignore_ascii_case(b"STREAMS"))
                .map_or(0, |at| at + 1);
            match (streams, n - streams) {
                (0, _) => Vec::new(),
                (start, after) if after % 2 == 0 => (start..start + after / 2).collect(),
                _ => Vec::new(),
            }
        }
    };
    if positions.is_empty() {
        return Err(format!(
            "wrong number of arguments for '{}'",
            String::from_utf8_lossy(&args[0]).to_lowercase()
        ));
    }
    Ok(positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
    }

    #[test]
    fn every_command_family_is_classified() {
        use Effect::*;
        let cases = [
            ("get k", Command::Keyed(Read(Missing::Nil), Keys::First)),
            ("Get k", Command::Keyed(Read(Missing::Nil), Keys::First)),
            ("zremrangebyscore k 0 1", Command::Keyed(Write, Keys::First)),
            ("getgetgetgetgetgetgetgetget k", Command::Unknown),
            (
                "lrange k 0 -1",
                Command::Keyed(Read(Missing::EmptyArray), Keys::First),
            ),
            (
                "pttl k",
                Command::Keyed(Read(Missing::MinusTwo), Keys::First),
            ),
            (
                "srandmember k",
                Command::Keyed(Read(Missing::Nil), Keys::First),
            ),
            (
                "srandmember k 3",
                Command::Keyed(Read(Missing::EmptyArray), Keys::First),
            ),
            (
                "lpos k e rank 1 count 2",
                Command::Keyed(Read(Missing::EmptyArray), Keys::First),
            ),
            ("lpos k e", Command::Keyed(Read(Missing::Nil), Keys::First)),
            ("mget a b", Command::Keyed(ReadEach, Keys::All)),
            ("exists a b", Command::Keyed(Count, Keys::All)),
            ("set k v", Command::Keyed(Write, Keys::First)),
            ("lpush k v", Command::Keyed(Write, Keys::First)),
            ("mset a 1 b 2", Command::Keyed(Write, Keys::Pairs)),
            ("rename a b", Command::Keyed(Write, Keys::FirstTwo)),
            ("expire k 10", Command::Keyed(Expire, Keys::First)),
            ("persist k", Command::Keyed(Expire, Keys::First)),
            ("unlink a b", Command::Keyed(Delete, Keys::All)),
            ("scan 0", Command::Scan),
            ("client setinfo lib-name x", Command::ClientName),
            ("frobnicate k", Command::Unknown),
        ];
        for (line, want) in cases {
            assert_eq!(classify(&args(line)), want, "{line}");
        }
    }

    #[test]
    fn what_reaches_beyond_one_subjects_keys_is_refused_outright() {
        for line in [
            "keys *",
            "flushall",
            "flushdb",
            "config get *",
            "debug sleep 1",
            "monitor",
            "shutdown",
            "save",
            "bgsave",
            "replicaof no one",
            "module list",
            "acl list",
            "client kill id 3",
            "client list",
            "eval return 1 0",
            "evalsha abc 0",
            "fcall f 0",
            "script load x",
            "dump k",
            "restore k 0 x",
            "migrate h 1 k 0 1",
            "copy a b db 1",
            "copy a b replace DB 2",
            "object encoding k",
            "wait 1 0",
            "psubscribe c*",
            "pubsub channels",
            "randomkey",
            "sort k by x_*",
            "blmove a b left right 0",
            "slowlog get",
            "memory usage k",
            "latency reset",
            "command getkeysandflags set k v",
        ] {
            assert!(
                matches!(classify(&args(line)), Command::Refused(_)),
                "{line} is not refused"
            );
        }
        for line in [
            "info",
            "info keyspace",
            "dbsize",
            "time",
            "command count",
            "memory stats",
            "latency latest",
        ] {
            assert!(
                matches!(classify(&args(line)), Command::Server),
                "{line} is not a server command"
            );
        }
    }

    #[test]
    fn waiting_commands_name_their_keys_and_how_long_they_wait() {
        use std::time::Duration;
        assert_eq!(
            key_positions(Keys::AllButLast, &args("blpop a b 0")),
            Ok(vec![1, 2])
        );
        assert!(key_positions(Keys::AllButLast, &args("blpop 0")).is_err());
        let xread = args("xread count 2 block 500 streams a b 0 $");
        assert_eq!(key_positions(Keys::Streams, &xread), Ok(vec![6, 7]));
        assert!(key_positions(Keys::Streams, &args("xread streams a b 0")).is_err());
        assert!(key_positions(Keys::Streams, &args("xread count 1")).is_err());
        assert_eq!(waits(&args("blpop a 0")), Ok(Some(None)), "0: for ever");
        assert_eq!(
            waits(&args("brpop a b 1.5")),
            Ok(Some(Some(Duration::from_millis(1500))))
        );
        assert_eq!(waits(&xread), Ok(Some(Some(Duration::from_millis(500)))));
        assert_eq!(waits(&args("xread streams a 0")), Ok(None));
        assert_eq!(waits(&args("lpop a")), Ok(None));
        assert!(waits(&args("blpop a -1")).is_err());
        assert!(waits(&args("blpop a soon")).is_err());
    }

    #[test]
    fn writes_that_answer_with_stored_data_are_reads_too() {
        for line in [
            "lpop k",
            "getset k v",
            "incr k",
            "set k v GET",
            "set k v ex 10 get",
            // The second outside attack read a score, memberships and a length through these.
            "zadd k xx incr 0 m",
            "zadd k 1 m",
            "sadd k m",
            "srem k m",
            "smove a b m",
            "hsetnx k f v",
            "lrem k 0 x",
            "append k x",
            "setrange k 0 x",
            // And the third a score, an entry, a length, existence and a type through these.
            "zremrangebyscore k 1 1",
            "zremrangebylex k [a [a",
            "xdel k 1-0",
            "xadd k 1-0 f v",
            "rpushx k v",
            "rpush k v",
            "lset k 10 v",
            "ltrim k 0 1",
            "setnx k v",
            "set k v nx",
            "set k v xx",
            "set k v get",
            "set k v ifeq guess",
            "set k v ex 10 ifne guess",
            "set k v px",
            "msetnx a 1 b 2",
            "renamenx a b",
            "copy a b",
            "expire k 1",
            "persist k",
            "del k",
            "hset k f v",
            "hmset k f v",
        ] {
            assert!(reveals(&args(line)), "{line}");
        }
        for line in [
            "set k v",
            "set k v px 100",
            "set k v EXAT 1900000000 keepttl",
            "set k get",
            "setex k 10 v",
            "psetex k 10 v",
            "mset a 1 b 2",
        ] {
            assert!(!reveals(&args(line)), "{line}");
        }
    }

    #[test]
    fn keys_are_found_where_each_command_puts_them() {
        assert_eq!(key_positions(Keys::First, &args("get k")), Ok(vec![1]));
        assert_eq!(
            key_positions(Keys::All, &args("del a b c")),
            Ok(vec![1, 2, 3])
        );
        assert_eq!(
            key_positions(Keys::Pairs, &args("mset a 1 b 2")),
            Ok(vec![1, 3])
        );
        assert!(key_positions(Keys::Pairs, &args("mset a 1 b")).is_err());
        assert_eq!(
            key_positions(Keys::FirstTwo, &args("copy a b")),
            Ok(vec![1, 2])
        );
        assert!(key_positions(Keys::First, &args("get")).is_err());
        assert!(key_positions(Keys::All, &args("del")).is_err());
    }
}
