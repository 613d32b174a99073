//! Azure AI Search's OData `$filter` language, the subset the service documents: comparisons
//! (`eq ne gt ge lt le`), `and` / `or` / `not` and parentheses, literals (strings in single quotes
//! with `''` for a quote, numbers, `true` / `false` / `null`, `NaN` / `INF` / `-INF`, date-times,
//! `geography'...'`), `search.in`, `search.ismatch`, `search.ismatchscoring`, `geo.distance`,
//! `geo.intersects`, and `any` / `all` over collections; `not` before comparisons, then `and`,
//! then `or` (Microsoft's published grammar).
//!
//! A client's filter is parsed here and written again from what was parsed: the service is sent
//! text Lethe understood, never the client's own, so an escape, an unbalanced parenthesis or
//! anything else this grammar does not know cannot change what the filter means between Lethe and
//! Azure. Pure; bounded in length and depth.

use std::fmt;

/// The longest filter taken, in bytes, and the deepest nesting.
pub const MAX_LEN: usize = 32 * 1024;
pub const MAX_DEPTH: usize = 64;

/// A parsed filter.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    Or(Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare(Operand, Op, Operand),
    /// `search.in`, `search.ismatch`, `search.ismatchscoring`, `geo.intersects`.
    Call(Function, Vec<Operand>),
    /// `path/any()`, `path/any(v: body)`, `path/all(v: body)`.
    Lambda {
        path: Path,
        all: bool,
        body: Option<(String, Box<Expr>)>,
    },
    /// A boolean literal or a boolean field.
    Operand(Operand),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    Field(Path),
    Literal(Literal),
    /// `geo.distance(...)`.
    Call(Function, Vec<Operand>),
}

/// A field path (`address/city`), or a lambda's variable and a path under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path(pub Vec<String>);

#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Str(String),
    /// A number as written (`42`, `-3.5`, `1e10`, `NaN`, `INF`, `-INF`).
    Number(String),
    Bool(bool),
    Null,
    /// A date-time offset as written (`2024-01-01T00:00:00Z`).
    DateTime(String),
    /// `geography'POINT(...)'`: the text in quotes.
    Geography(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Function {
    SearchIn,
    IsMatch,
    IsMatchScoring,
    GeoDistance,
    GeoIntersects,
}

impl Function {
    fn named(name: &str) -> Option<Function> {
        Some(match name {
            "search.in" => Function::SearchIn,
            "search.ismatch" => Function::IsMatch,
            "search.ismatchscoring" => Function::IsMatchScoring,
            "geo.distance" => Function::GeoDistance,
            "geo.intersects" => Function::GeoIntersects,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Function::SearchIn => "search.in",
            Function::IsMatch => "search.ismatch",
            Function::IsMatchScoring => "search.ismatchscoring",
            Function::GeoDistance => "geo.distance",
            Function::GeoIntersects => "geo.intersects",
        }
    }

    /// Whether it is a boolean function (else it yields a value to compare).
    fn is_boolean(self) -> bool {
        self != Function::GeoDistance
    }
}

/// Why a filter is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ODataError(pub String);

impl fmt::Display for ODataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$filter: {}", self.0)
    }
}

fn error<T>(message: impl Into<String>) -> Result<T, ODataError> {
    Err(ODataError(message.into()))
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// An identifier or a dotted function name or a path element.
    Name(String),
    Str(String),
    Number(String),
    DateTime(String),
    Geography(String),
    Open,
    Close,
    Comma,
    Colon,
    Slash,
}

fn lex(text: &str) -> Result<Vec<Token>, ODataError> {
    if text.len() > MAX_LEN {
        return error(format!("longer than {MAX_LEN} bytes"));
    }
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        match c {
            ' ' | '\t' | '\r' | '\n' => i += 1,
            '(' | ')' | ',' | ':' | '/' => {
                tokens.push(match c {
                    '(' => Token::Open,
                    ')' => Token::Close,
                    ',' => Token::Comma,
                    ':' => Token::Colon,
                    _ => Token::Slash,
                });
                i += 1;
            }
            '\'' => {
                let (text, next) = quoted(&chars, i)?;
                tokens.push(Token::Str(text));
                i = next;
            }
            c if c.is_ascii_digit()
                || (c == '-'
                    && chars
                        .get(i + 1)
                        .is_some_and(|d| d.is_ascii_digit() || *d == 'I')) =>
            {
                let start = i;
                i += 1;
                while chars.get(i).is_some_and(|d| {
                    d.is_ascii_alphanumeric() || matches!(d, '.' | ':' | '-' | '+')
                }) {
                    // A sign inside a number is an exponent's, or a date-time's offset.
                    i += 1;
                }
                let written: String = chars[start..i].iter().collect();
                tokens.push(number_or_date(&written)?);
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_alphanumeric() || matches!(d, '_' | '.'))
                {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                if name == "geography" && chars.get(i) == Some(&'\'') {
                    let (text, next) = quoted(&chars, i)?;
                    tokens.push(Token::Geography(text));
                    i = next;
                } else {
                    tokens.push(Token::Name(name));
                }
            }
            other => return error(format!("unexpected {other:?}")),
        }
    }
    Ok(tokens)
}

/// A quoted string starting at `start`: its text (`''` read as one quote) and where it ends.
fn quoted(chars: &[char], start: usize) -> Result<(String, usize), ODataError> {
    let mut text = String::new();
    let mut i = start + 1;
    loop {
        match chars.get(i) {
            None => return error("a string is not closed"),
            Some('\'') if chars.get(i + 1) == Some(&'\'') => {
                text.push('\'');
                i += 2;
            }
            Some('\'') => return Ok((text, i + 1)),
            Some(&c) => {
                text.push(c);
                i += 1;
            }
        }
    }
}

fn number_or_date(written: &str) -> Result<Token, ODataError> {
    let date = written.len() >= 10
        && written.as_bytes().get(4) == Some(&b'-')
        && chrono::DateTime::parse_from_rfc3339(written).is_ok();
    if date {
        return Ok(Token::DateTime(written.to_owned()));
    }
    if written == "-INF" || written.parse::<f64>().is_ok_and(f64::is_finite) {
        return Ok(Token::Number(written.to_owned()));
    }
    error(format!("{written:?} is not a number or a date-time"))
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn expect(&mut self, token: Token) -> Result<(), ODataError> {
        match self.next() {
            Some(t) if t == token => Ok(()),
            other => error(format!("expected {token:?}, found {other:?}")),
        }
    }

    fn keyword(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Name(n)) if n == word)
    }

    fn deeper(&mut self) -> Result<(), ODataError> {
        self.depth += 1;
        match self.depth > MAX_DEPTH {
            true => error(format!("nested deeper than {MAX_DEPTH}")),
            false => Ok(()),
        }
    }

    fn or(&mut self) -> Result<Expr, ODataError> {
        self.deeper()?;
        let mut left = self.and()?;
        while self.keyword("or") {
            self.at += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        self.depth -= 1;
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, ODataError> {
        let mut left = self.unary()?;
        while self.keyword("and") {
            self.at += 1;
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ODataError> {
        if self.keyword("not") {
            self.at += 1;
            self.deeper()?;
            let parenthesised = self.peek() == Some(&Token::Open);
            let inner = self.unary()?;
            self.depth -= 1;
            // `not` binds tighter than a comparison: Azure refuses `not rating gt 5`.
            if !parenthesised && matches!(inner, Expr::Compare(..)) {
                return error("not applies to a condition in parentheses: not (a eq 1)");
            }
            return Ok(Expr::Not(Box::new(inner)));
        }
        if self.peek() == Some(&Token::Open) {
            self.at += 1;
            let inner = self.or()?;
            self.expect(Token::Close)?;
            return Ok(inner);
        }
        let left = self.operand()?;
        let op = match self.peek() {
            Some(Token::Name(n)) => match n.as_str() {
                "eq" => Some(Op::Eq),
                "ne" => Some(Op::Ne),
                "gt" => Some(Op::Gt),
                "ge" => Some(Op::Ge),
                "lt" => Some(Op::Lt),
                "le" => Some(Op::Le),
                _ => None,
            },
            _ => None,
        };
        match (op, left) {
            (Some(op), left) => {
                self.at += 1;
                let right = self.operand()?;
                if matches!((&left, &right), (Operand::Literal(_), Operand::Literal(_))) {
                    return error("a comparison names a field or geo.distance");
                }
                let null = |o: &Operand| matches!(o, Operand::Literal(Literal::Null));
                if !matches!(op, Op::Eq | Op::Ne) && (null(&left) || null(&right)) {
                    return error("null is compared with eq or ne only");
                }
                Ok(Expr::Compare(left, op, right))
            }
            (None, Operand::Call(function, args)) if function.is_boolean() => {
                Ok(Expr::Call(function, args))
            }
            (None, Operand::Field(path)) if self.peek() == Some(&Token::Slash) => self.lambda(path),
            (None, operand @ (Operand::Field(_) | Operand::Literal(Literal::Bool(_)))) => {
                Ok(Expr::Operand(operand))
            }
            (None, other) => error(format!("{other:?} is not a condition")),
        }
    }

    /// `path/any(...)` or `path/all(...)`, the path read already.
    fn lambda(&mut self, path: Path) -> Result<Expr, ODataError> {
        self.expect(Token::Slash)?;
        let all = match self.next() {
            Some(Token::Name(n)) if n == "any" => false,
            Some(Token::Name(n)) if n == "all" => true,
            other => return error(format!("expected any or all, found {other:?}")),
        };
        self.expect(Token::Open)?;
        if !all && self.peek() == Some(&Token::Close) {
            self.at += 1;
            return Ok(Expr::Lambda {
                path,
                all,
                body: None,
            });
        }
        let variable = match self.next() {
            Some(Token::Name(n)) if identifier(&n) => n,
            other => return error(format!("expected a lambda variable, found {other:?}")),
        };
        self.expect(Token::Colon)?;
        let body = self.or()?;
        self.expect(Token::Close)?;
        Ok(Expr::Lambda {
            path,
            all,
            body: Some((variable, Box::new(body))),
        })
    }

    fn operand(&mut self) -> Result<Operand, ODataError> {
        match self.next() {
            Some(Token::Str(s)) => Ok(Operand::Literal(Literal::Str(s))),
            Some(Token::Number(n)) => Ok(Operand::Literal(Literal::Number(n))),
            Some(Token::DateTime(d)) => Ok(Operand::Literal(Literal::DateTime(d))),
            Some(Token::Geography(g)) => Ok(Operand::Literal(Literal::Geography(g))),
            Some(Token::Name(name)) => match name.as_str() {
                "true" => Ok(Operand::Literal(Literal::Bool(true))),
                "false" => Ok(Operand::Literal(Literal::Bool(false))),
                "null" => Ok(Operand::Literal(Literal::Null)),
                "NaN" | "INF" => Ok(Operand::Literal(Literal::Number(name))),
                _ if name.contains('.') => {
                    let function = Function::named(&name)
                        .ok_or_else(|| ODataError(format!("no function {name}")))?;
                    self.expect(Token::Open)?;
                    let mut args = Vec::new();
                    while self.peek() != Some(&Token::Close) {
                        if !args.is_empty() {
                            self.expect(Token::Comma)?;
                        }
                        args.push(self.operand()?);
                    }
                    self.at += 1;
                    arity(function, &args)?;
                    Ok(Operand::Call(function, args))
                }
                _ if identifier(&name) && !KEYWORDS.contains(&name.as_str()) => {
                    let mut path = vec![name];
                    // A path goes on while a name follows a slash (`any` / `all` are lambdas).
                    while self.peek() == Some(&Token::Slash) {
                        match self.tokens.get(self.at + 1) {
                            Some(Token::Name(n))
                                if identifier(n) && !matches!(n.as_str(), "any" | "all") =>
                            {
                                path.push(n.clone());
                                self.at += 2;
                            }
                            _ => break,
                        }
                    }
                    Ok(Operand::Field(Path(path)))
                }
                _ => error(format!("unexpected {name:?}")),
            },
            other => error(format!("expected a field or a value, found {other:?}")),
        }
    }
}

const KEYWORDS: &[&str] = &[
    "and", "or", "not", "eq", "ne", "gt", "ge", "lt", "le", "any", "all",
];

fn identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.contains('.')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The arguments each function takes: fields and string literals where Azure wants them.
fn arity(function: Function, args: &[Operand]) -> Result<(), ODataError> {
    let field = |a: &Operand| matches!(a, Operand::Field(_));
    let text = |a: &Operand| matches!(a, Operand::Literal(Literal::Str(_)));
    let geo = |a: &Operand| matches!(a, Operand::Literal(Literal::Geography(_)));
    let ok = match function {
        Function::SearchIn => {
            (2..=3).contains(&args.len()) && field(&args[0]) && args[1..].iter().all(text)
        }
        Function::IsMatch | Function::IsMatchScoring => {
            (1..=4).contains(&args.len()) && args.iter().all(text)
        }
        Function::GeoDistance | Function::GeoIntersects => {
            args.len() == 2 && args.iter().any(field) && args.iter().any(geo)
        }
    };
    match ok {
        true => Ok(()),
        false => error(format!("{} takes other arguments", function.name())),
    }
}

/// Parses a client's filter.
pub fn parse(text: &str) -> Result<Expr, ODataError> {
    let mut parser = Parser {
        tokens: lex(text)?,
        at: 0,
        depth: 0,
    };
    if parser.tokens.is_empty() {
        return error("empty");
    }
    let expr = parser.or()?;
    match parser.peek() {
        None => Ok(expr),
        Some(extra) => error(format!("unexpected {extra:?} after the filter")),
    }
}

impl Expr {
    /// Every field the filter reads: paths (a lambda's variable resolved to its collection),
    /// `search.in`'s field, and the fields `search.ismatch*` names in its second argument.
    pub fn fields(&self) -> Vec<String> {
        let mut fields = Vec::new();
        self.collect(&mut fields, &[]);
        fields.sort();
        fields.dedup();
        fields
    }

    fn collect(&self, fields: &mut Vec<String>, lambdas: &[(String, String)]) {
        match self {
            Expr::Or(a, b) | Expr::And(a, b) => {
                a.collect(fields, lambdas);
                b.collect(fields, lambdas);
            }
            Expr::Not(a) => a.collect(fields, lambdas),
            Expr::Compare(a, _, b) => {
                a.collect(fields, lambdas);
                b.collect(fields, lambdas);
            }
            Expr::Call(function, args) => call_fields(*function, args, fields, lambdas),
            Expr::Lambda { path, body, .. } => {
                let collection = path.resolved(lambdas);
                if let Some((variable, body)) = body {
                    let mut inner = lambdas.to_vec();
                    inner.push((variable.clone(), collection.clone()));
                    body.collect(fields, &inner);
                }
                fields.push(collection);
            }
            Expr::Operand(operand) => operand.collect(fields, lambdas),
        }
    }
}

fn call_fields(
    function: Function,
    args: &[Operand],
    fields: &mut Vec<String>,
    lambdas: &[(String, String)],
) {
    match function {
        Function::IsMatch | Function::IsMatchScoring => {
            if let Some(Operand::Literal(Literal::Str(named))) = args.get(1) {
                fields.extend(
                    named
                        .split(',')
                        .map(str::trim)
                        .filter(|f| !f.is_empty())
                        .map(str::to_owned),
                );
            }
        }
        _ => args.iter().for_each(|a| a.collect(fields, lambdas)),
    }
}

impl Operand {
    fn collect(&self, fields: &mut Vec<String>, lambdas: &[(String, String)]) {
        match self {
            Operand::Field(path) => fields.push(path.resolved(lambdas)),
            Operand::Literal(_) => {}
            Operand::Call(function, args) => call_fields(*function, args, fields, lambdas),
        }
    }
}

impl Path {
    /// The field path this names, a lambda variable replaced by its collection's path.
    fn resolved(&self, lambdas: &[(String, String)]) -> String {
        let head = self.0.first().map(String::as_str).unwrap_or_default();
        let mut parts: Vec<String> = match lambdas.iter().rev().find(|(v, _)| v == head) {
            Some((_, collection)) => vec![collection.clone()],
            None => vec![head.to_owned()],
        };
        parts.extend(self.0.iter().skip(1).cloned());
        parts.join("/")
    }
}

/// Written again, every operation in parentheses: what the service is sent.
impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Or(a, b) => write!(f, "({a}) or ({b})"),
            Expr::And(a, b) => write!(f, "({a}) and ({b})"),
            Expr::Not(a) => write!(f, "not ({a})"),
            Expr::Compare(a, op, b) => write!(f, "{a} {} {b}", op.name()),
            Expr::Call(function, args) => write_call(f, *function, args),
            Expr::Lambda { path, all, body } => {
                let quantifier = if *all { "all" } else { "any" };
                match body {
                    None => write!(f, "{path}/{quantifier}()"),
                    Some((variable, body)) => write!(f, "{path}/{quantifier}({variable}: {body})"),
                }
            }
            Expr::Operand(operand) => write!(f, "{operand}"),
        }
    }
}

fn write_call(f: &mut fmt::Formatter<'_>, function: Function, args: &[Operand]) -> fmt::Result {
    write!(f, "{}(", function.name())?;
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{arg}")?;
    }
    write!(f, ")")
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Eq => "eq",
            Op::Ne => "ne",
            Op::Gt => "gt",
            Op::Ge => "ge",
            Op::Lt => "lt",
            Op::Le => "le",
        }
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Field(path) => write!(f, "{path}"),
            Operand::Literal(literal) => write!(f, "{literal}"),
            Operand::Call(function, args) => write_call(f, *function, args),
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.join("/"))
    }
}

impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::Str(s) => write!(f, "'{}'", s.replace('\'', "''")),
            Literal::Number(n) | Literal::DateTime(n) => write!(f, "{n}"),
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Null => write!(f, "null"),
            Literal::Geography(g) => write!(f, "geography'{}'", g.replace('\'', "''")),
        }
    }
}

#[cfg(test)]
mod tests;
