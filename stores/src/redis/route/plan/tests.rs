use super::read::combine_plan;
use super::*;
use crate::redis::commands::classify;

fn args(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|a| a.as_bytes().to_vec()).collect()
}

fn sent(plan: &Plan) -> Vec<String> {
    plan.send
        .first()
        .map(|c| {
            c.iter()
                .map(|a| String::from_utf8_lossy(a).into())
                .collect()
        })
        .unwrap_or_default()
}

fn combined(line: &str, hidden: &[bool]) -> Plan {
    let args = args(line);
    let Command::Keyed(Effect::Combine(how), keys) = classify(&args) else {
        panic!("{line} combines no sets");
    };
    let positions = key_positions(keys, &args).unwrap();
    combine_plan(how, keys, &args, &positions, hidden)
}

#[test]
fn a_hidden_key_combines_as_a_missing_one() {
    let union = combined("SUNION a b c", &[false, true, false]);
    assert_eq!(sent(&union), ["SUNION", "a", "c"]);
    let weighted = combined(
        "ZUNION 3 a b c WEIGHTS 1 2 3 WITHSCORES",
        &[false, true, false],
    );
    assert_eq!(
        sent(&weighted),
        ["ZUNION", "2", "a", "c", "WEIGHTS", "1", "3", "WITHSCORES"]
    );
    for (line, hidden) in [
        ("SINTER a b", [false, true]),
        ("SDIFF a b", [true, false]),
        ("ZINTER 2 a b", [true, false]),
        ("SUNION a b", [true, true]),
    ] {
        let plan = combined(line, &hidden);
        assert!(plan.send.is_empty(), "{line}: nothing sent");
        let empty = plan.assemble(Vec::new());
        assert!(
            matches!(&empty, Reply::Set(s) if s.is_empty())
                || matches!(&empty, Reply::Array(a) if a.is_empty()),
            "{line}: {empty:?}"
        );
    }
    assert_eq!(
        sent(&combined("SDIFF a b c", &[false, true, false])),
        ["SDIFF", "a", "c"]
    );
    let count = combined("SINTERCARD 2 a b LIMIT 5", &[false, true]);
    assert_eq!(count.assemble(Vec::new()), Reply::Int(0));
    assert_eq!(
        sent(&combined("SUNION a b", &[false, false])),
        ["SUNION", "a", "b"]
    );
}
