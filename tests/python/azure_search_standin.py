"""A local stand-in for Azure AI Search's data plane (indexes and documents), built from its
published REST contract, api-versions 2024-07-01, 2025-09-01 and 2026-04-01 (what
azure-search-documents 12.0.0 sends). Sources (read 2026-12): the REST reference (Search,
Suggest, Autocomplete, Index and Count Documents, Create/Get/List/Delete Index), the OData
`$filter` syntax reference and its EBNF, "Search pagination", "Service limits", "Delete
documents" and "Troubleshoot storage metrics" on learn.microsoft.com, and the SDK's own requests
captured on loopback.

What it implements, in both URL forms (`/indexes('x')/docs/search.post.search` as the SDK sends,
`/indexes/x/docs/search` as the docs write):
- `api-key` must be the admin key (403 otherwise); `api-version` one of the three above (400).
- Indexes: `POST /indexes` (201 with the index, omitted attributes true where the type allows;
  400 `ResourceNameAlreadyInUse` for a duplicate), `PUT /indexes('x')` (create 201, or update
  200 adding fields; dropping or retyping one is 400), `GET /indexes` (`{"value": [...]}`),
  `GET` / `DELETE /indexes('x')` (404 / 204).
- `POST .../docs/search.index`: `upload`, `merge`, `mergeOrUpload`, `delete`; at most 1 000 actions
  (400); per item `{"key", "status", "errorMessage", "statusCode"}` (201 created, 200 replaced or
  deleted, 404 "Document not found." for a merge of a missing one); 200 when every item succeeded,
  207 otherwise.
- `POST .../docs/search.post.search`: `search` (simple: any term of any searchable field, case
  folded; `*` or none: everything), `searchFields`, `searchMode`, `filter` (the OData subset
  below, on filterable fields only, else 400), `select`, `orderby`, `top` (default 50, at most
  1 000), `skip` (at most 100 000), `count`, `facets` (value counts), `vectorQueries` (`kind:
  vector`, cosine, `k`; `vectorFilterMode` preFilter or postFilter). Pages: with `top` omitted and
  more matches than the 50 returned, `@search.nextPageParameters` is the request with `skip`
  moved on (the SDK posts it as the next body) and `@odata.nextLink` the URL to post it to.
- `GET .../docs('key')` (with `$select`), `GET .../docs/$count` (plain text), `POST
  .../docs/search.post.suggest` and `.../search.post.autocomplete` (prefix matches in the
  suggester's source fields).
- OData `$filter`: `eq ne gt ge lt le`, `and or not` (not before comparisons), parentheses,
  strings with `''`, numbers, booleans, null, date-times, `search.in`, `search.ismatch`,
  `any`/`all` over collections. `geo.*` is refused (400): nothing Lethe relies on uses it.
- Deleted documents: `$count` and searches drop them at once; `GET /indexes('x')/search.stats`
  reports `storageSize` that still counts them until a simulated merge (`POST /_merge`), as
  Microsoft documents deleted documents staying in segments until background merges (24-72 h).
- Indexers: `POST /indexers` keeps a definition (`name`, `dataSourceName`, `targetIndexName`;
  never run), `GET /indexers` lists them.
- Facets: on facetable fields only (400 otherwise), `count:N` values (10 by default), the most
  frequent first, null values left out.
- For the tests (no key needed, not Azure's): `GET /_batches` answers the number of actions of
  each indexing batch it carried out, by index, in order; `GET /_searches` the number of
  searches, suggests and autocompletes it served, by index.

    python azure_search_standin.py PORT ADMIN_KEY
"""

import json
import math
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

VERSIONS = {"2024-07-01", "2025-09-01", "2026-04-01"}
LOCK = threading.Lock()
INDEXES = {}     # name -> {"definition", "docs": {key: doc}, "deleted_bytes": int}
BATCHES = {}     # name -> [number of actions of each batch carried out]
SEARCHES = {}    # name -> number of searches, suggests and autocompletes served
INDEXERS = {}    # name -> definition (kept, never run)
PAGE, MAX_TOP, MAX_SKIP, MAX_BATCH = 50, 1000, 100_000, 1000


class Refused(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


# --- OData $filter -----------------------------------------------------------------------------

TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<geo>geography'(?:[^']|'')*')|"
                   r"(?P<dt>\d{4}-\d\d-\d\dT[0-9:.]+(?:Z|[+-]\d\d:\d\d))|(?P<num>-?(?:\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|INF))|"
                   r"(?P<name>[A-Za-z_][A-Za-z0-9_.]*)|(?P<punct>[(),:/]))")


def tokens(text):
    out, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        m = TOKEN.match(text, at)
        if not m:
            raise Refused(400, "InvalidRequestParameter", f"Invalid expression: syntax error at position {at} in '{text}'.")
        kind = m.lastgroup
        value = m.group(kind)
        out.append((kind, value))
        at = m.end()
    return out


class Filter:
    def __init__(self, text, index):
        self.items, self.at, self.index = tokens(text), 0, index
        self.tree = self.or_()
        if self.at != len(self.items):
            self.fail()

    def fail(self):
        raise Refused(400, "InvalidRequestParameter", "Invalid expression: the filter does not parse.")

    def peek(self):
        return self.items[self.at] if self.at < len(self.items) else (None, None)

    def take(self, value=None):
        kind, got = self.peek()
        if kind is None or (value is not None and got != value):
            self.fail()
        self.at += 1
        return kind, got

    def or_(self):
        left = self.and_()
        while self.peek() == ("name", "or"):
            self.take()
            left = ("or", left, self.and_())
        return left

    def and_(self):
        left = self.unary()
        while self.peek() == ("name", "and"):
            self.take()
            left = ("and", left, self.unary())
        return left

    def unary(self):
        if self.peek() == ("name", "not"):
            self.take()
            parenthesised = self.peek() == ("punct", "(")
            inner = self.unary()
            if not parenthesised and inner[0] == "cmp":
                raise Refused(400, "InvalidRequestParameter", "A unary operator with an incompatible type was detected.")
            return ("not", inner)
        if self.peek() == ("punct", "("):
            self.take()
            inner = self.or_()
            self.take(")")
            return inner
        left = self.operand()
        kind, op = self.peek()
        if kind == "name" and op in ("eq", "ne", "gt", "ge", "lt", "le"):
            self.take()
            right = self.operand()
            if (op not in ("eq", "ne")) and ("null" in (left, right)):
                raise Refused(400, "InvalidRequestParameter", "null is compared with eq or ne only.")
            return ("cmp", op, left, right)
        if left[0] == "call":
            return left
        if left[0] == "field" and self.peek() == ("punct", "/"):
            return self.lambda_(left)
        if left[0] == "field" or left in (("lit", True), ("lit", False)):
            return ("bool", left)
        self.fail()

    def lambda_(self, field):
        self.take("/")
        _, quantifier = self.take()
        if quantifier not in ("any", "all"):
            self.fail()
        self.take("(")
        if quantifier == "any" and self.peek() == ("punct", ")"):
            self.take()
            return ("lambda", "any", field, None, None)
        _, variable = self.take()
        self.take(":")
        body = self.or_()
        self.take(")")
        return ("lambda", quantifier, field, variable, body)

    def operand(self):
        kind, value = self.take()
        if kind == "str":
            return ("lit", value[1:-1].replace("''", "'"))
        if kind == "num":
            return ("lit", math.inf * (-1 if value.startswith("-") else 1) if "INF" in value else float(value))
        if kind == "dt":
            return ("lit", value)
        if kind == "name" and value in ("true", "false"):
            return ("lit", value == "true")
        if kind == "name" and value == "null":
            return "null"
        if kind == "name" and value == "NaN":
            return ("lit", math.nan)
        if kind == "name" and value in ("search.in", "search.ismatch", "search.ismatchscoring"):
            self.take("(")
            args = [self.operand()]
            while self.peek() == ("punct", ","):
                self.take()
                args.append(self.operand())
            self.take(")")
            return ("call", value, args)
        if kind == "name" and value.startswith("geo."):
            raise Refused(400, "InvalidRequestParameter", "geo functions are not served by this stand-in.")
        if kind == "name" and "." not in value and value not in ("and", "or", "not", "any", "all"):
            path = [value]
            while self.peek() == ("punct", "/") and self.at + 1 < len(self.items) \
                    and self.items[self.at + 1][0] == "name" and self.items[self.at + 1][1] not in ("any", "all"):
                self.take()
                path.append(self.take()[1])
            return ("field", "/".join(path))
        self.fail()

    def check_fields(self, tree, variables=()):
        """Every field read must be filterable (a lambda variable stands for its collection)."""
        if isinstance(tree, tuple) and tree and tree[0] == "field":
            head = tree[1].split("/")[0]
            if head in variables:
                return
            field = self.index.field(tree[1])
            if field is None or not field.get("filterable"):
                raise Refused(400, "InvalidRequestParameter", f"Invalid expression: '{tree[1]}' is not a filterable field.")
        elif isinstance(tree, tuple) and tree and tree[0] == "lambda":
            self.check_fields(tree[2], variables)
            if tree[4] is not None:
                self.check_fields(tree[4], variables + (tree[3],))
        elif isinstance(tree, tuple):
            for part in tree[1:]:
                if isinstance(part, (tuple, list)):
                    for p in (part if isinstance(part, list) else [part]):
                        self.check_fields(p, variables)

    def matches(self, doc):
        return truth(evaluate(self.tree, doc, {}))


def value_of(operand, doc, scope):
    if operand == "null":
        return None
    kind = operand[0]
    if kind == "lit":
        return operand[1]
    if kind == "field":
        head, *rest = operand[1].split("/")
        value = scope[head] if head in scope else doc.get(head)
        for part in rest:
            value = value.get(part) if isinstance(value, dict) else None
        return value
    return evaluate(operand, doc, scope)


def compare(op, a, b):
    if op == "eq":
        return a == b
    if op == "ne":
        return a != b
    if a is None or b is None:
        return False
    try:
        return {"gt": a > b, "ge": a >= b, "lt": a < b, "le": a <= b}[op]
    except TypeError:
        return False


def truth(value):
    return value is True


def evaluate(tree, doc, scope):
    kind = tree[0]
    if kind == "or":
        return truth(evaluate(tree[1], doc, scope)) or truth(evaluate(tree[2], doc, scope))
    if kind == "and":
        return truth(evaluate(tree[1], doc, scope)) and truth(evaluate(tree[2], doc, scope))
    if kind == "not":
        return not truth(evaluate(tree[1], doc, scope))
    if kind == "cmp":
        return compare(tree[1], value_of(tree[2], doc, scope), value_of(tree[3], doc, scope))
    if kind == "bool":
        return value_of(tree[1], doc, scope) is True
    if kind == "call":
        name, args = tree[1], [value_of(a, doc, scope) for a in tree[2]]
        if name == "search.in":
            delimiters = args[2] if len(args) > 2 else " ,"
            return args[0] in [v for v in re.split("[" + re.escape(delimiters) + "]", args[1]) if v]
        text = str(args[0]).lower()
        fields = [f.strip() for f in args[1].split(",")] if len(args) > 1 else list(doc)
        return any(text in str(doc.get(f, "")).lower() for f in fields)
    if kind == "lambda":
        items = value_of(tree[2], doc, scope) or []
        if tree[3] is None:
            return bool(items)
        results = (truth(evaluate(tree[4], doc, {**scope, tree[3]: item})) for item in items)
        return all(results) if tree[1] == "all" else any(results)
    raise Refused(400, "InvalidRequestParameter", "Invalid expression.")


# --- Indexes and documents ---------------------------------------------------------------------

class Index:
    def __init__(self, definition):
        self.definition, self.docs, self.stored_bytes = definition, {}, 0
        self.key = next(f["name"] for f in definition["fields"] if f.get("key"))

    def field(self, path):
        fields = self.definition["fields"]
        found = None
        for part in path.split("/"):
            found = next((f for f in fields if f["name"] == part), None)
            if found is None:
                return None
            fields = found.get("fields") or []
        return found

    def searchable(self):
        return [f["name"] for f in self.definition["fields"] if f.get("searchable") and "Edm.String" in f["type"]]


def with_defaults(definition):
    for field in definition.get("fields", []):
        vector = field["type"].startswith("Collection(Edm.Single")
        text = field["type"] in ("Edm.String", "Collection(Edm.String)")
        for attribute, default in (("searchable", text or vector), ("filterable", not vector),
                                   ("sortable", not vector and not field["type"].startswith("Collection")),
                                   ("facetable", not vector), ("retrievable", True), ("key", False)):
            if field.get(attribute) is None:
                field[attribute] = default
    return definition


def listed(value):
    if value is None:
        return None
    return [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]


def projected(doc, select):
    return {k: v for k, v in doc.items() if select is None or k in select}


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def search(index, request):
    top = request.get("top")
    skip = request.get("skip") or 0
    if (top is not None and not 0 <= top <= MAX_TOP) or not 0 <= skip <= MAX_SKIP:
        raise Refused(400, "ParameterValueOutOfRange", "Value must be between 0 and 100000. Parameter name: $skip")
    condition = Filter(request["filter"], index) if request.get("filter") else None
    if condition:
        condition.check_fields(condition.tree)
    text = (request.get("search") or "*").strip()
    fields = listed(request.get("searchFields")) or index.searchable()
    terms = [t.lower() for t in re.findall(r"\w+", text)] if text != "*" else []
    scored = []
    for doc in index.docs.values():
        if condition and not condition.matches(doc):
            continue
        words = " ".join(str(doc.get(f, "")) for f in fields).lower()
        hits = sum(words.count(t) for t in terms)
        mode_all = request.get("searchMode") == "all"
        if terms and (not hits or (mode_all and not all(t in words for t in terms))):
            continue
        scored.append((float(hits) if terms else 1.0, doc))
    for query in request.get("vectorQueries") or []:
        if query.get("kind") != "vector":
            raise Refused(400, "InvalidRequestParameter", "Only vector queries of kind 'vector' are served.")
        fields, vector = query.get("fields"), query.get("vector")
        if not isinstance(fields, str) or not isinstance(vector, list):
            raise Refused(400, "InvalidRequestParameter", "A vector query needs 'fields' and 'vector'.")
        field = fields.split(",")[0].strip()
        described = index.field(field)
        if described is None or not described["type"].startswith("Collection(Edm.Single"):
            raise Refused(400, "InvalidRequestParameter", f"'{field}' is not a vector field of this index.")
        ranked = sorted(((cosine(vector, d.get(field) or []), d) for _, d in scored),
                        key=lambda pair: -pair[0])
        scored = ranked[:query.get("k") or 50]
    for clause in reversed(listed(request.get("orderby")) or []):
        name, _, direction = clause.partition(" ")
        scored.sort(key=lambda pair: (pair[1].get(name) is None, pair[1].get(name)), reverse=direction == "desc")
    if not request.get("orderby"):
        scored.sort(key=lambda pair: -pair[0])
    select = listed(request.get("select"))
    page = scored[skip:skip + (top if top is not None else PAGE)]
    answer = {"value": [{"@search.score": score, **projected(doc, select)} for score, doc in page]}
    if request.get("count"):
        answer["@odata.count"] = len(scored)
    if request.get("facets"):
        answer["@search.facets"] = {}
        for facet in request["facets"]:
            name, *options = facet.split(",")
            field = index.field(name)
            if field is None or not field.get("facetable"):
                raise Refused(400, "InvalidRequestParameter",
                              f"Invalid expression: The field '{name}' in the facet expression is not facetable.")
            count = int(dict(o.split(":", 1) for o in options).get("count", 10))
            counts = {}
            for _, doc in scored:
                if doc.get(name) is not None:
                    counts[doc.get(name)] = counts.get(doc.get(name), 0) + 1
            ranked = sorted(counts.items(), key=lambda vc: (-vc[1], str(vc[0])))[:count]
            answer["@search.facets"][name] = [{"value": v, "count": c} for v, c in ranked]
    if top is None and skip + PAGE < len(scored):
        answer["@search.nextPageParameters"] = {**request, "skip": skip + PAGE}
    return answer


def index_batch(index, actions):
    if len(actions) > MAX_BATCH:
        raise Refused(400, "InvalidRequestParameter", f"The request is invalid. Details: actions : at most {MAX_BATCH}.")
    results = []
    for action in actions:
        kind = action.get("@search.action", "upload")
        doc = {k: v for k, v in action.items() if not k.startswith("@")}
        key = doc.get(index.key)
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9\-=][A-Za-z0-9_\-=]*", key):
            raise Refused(400, "InvalidDocumentKey", f"Invalid document key: '{key}'")
        held = index.docs.get(key)
        if kind == "delete":
            if held:
                index.stored_bytes += len(json.dumps(held))
                del index.docs[key]
            results.append((key, 200, None))
        elif kind == "merge" and held is None:
            results.append((key, 404, "Document not found."))
        elif kind in ("merge", "mergeOrUpload") and held is not None:
            index.stored_bytes += len(json.dumps(held))
            index.docs[key] = {**held, **doc}
            results.append((key, 200, None))
        elif kind in ("upload", "mergeOrUpload"):
            if held is not None:
                index.stored_bytes += len(json.dumps(held))
            index.docs[key] = doc
            results.append((key, 200 if held is not None else 201, None))
        else:
            results.append((key, 400, f"Unknown action {kind}"))
    value = [{"key": k, "status": code < 300, "errorMessage": m, "statusCode": code} for k, code, m in results]
    return (200 if all(v["status"] for v in value) else 207), {"value": value}


def route(path):
    """(index name or None, the rest) of a raw path, in either URL form."""
    m = re.fullmatch(r"/indexes\('([^']*)'\)(.*)", path) or re.fullmatch(r"/indexes/([^/]+)(.*)", path)
    if m:
        return unquote(m.group(1)), m.group(2)
    return None, path


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    key = ""

    def log_message(self, *args):
        pass

    def send(self, status, body=None, content_type="application/json"):
        raw = b"" if body is None else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def handle_any(self, method):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        try:
            if url.path == "/_batches" and method == "GET":
                with LOCK:
                    return self.send(200, BATCHES)
            if url.path == "/_searches" and method == "GET":
                with LOCK:
                    return self.send(200, SEARCHES)
            if url.path == "/_merge" and method == "POST":
                with LOCK:
                    for index in INDEXES.values():
                        index.stored_bytes = 0
                return self.send(204)
            if self.headers.get("api-key") != self.key:
                raise Refused(403, "Forbidden", "Access denied: the api-key is not valid.")
            if query.get("api-version", [None])[0] not in VERSIONS:
                raise Refused(400, "InvalidRequestParameter", "Invalid or missing api-version query string parameter.")
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            with LOCK:
                status, answer, content_type = self.dispatch(method, url.path, query, body)
            self.send(status, answer, content_type)
        except Refused as e:
            self.send(e.status, {"error": {"code": e.code, "message": e.message}})

    def dispatch(self, method, path, query, body):
        name, rest = route(path)
        if name is None:
            if path == "/indexes" and method == "POST":
                if body["name"] in INDEXES:
                    raise Refused(400, "ResourceNameAlreadyInUse", f"Cannot create index '{body['name']}' because it already exists.")
                INDEXES[body["name"]] = Index(with_defaults(body))
                return 201, body, "application/json"
            if path == "/indexes" and method == "GET":
                return 200, {"value": [i.definition for i in INDEXES.values()]}, "application/json"
            if path == "/indexers" and method == "POST":
                INDEXERS[body["name"]] = body
                return 201, body, "application/json"
            if path == "/indexers" and method == "GET":
                return 200, {"value": list(INDEXERS.values())}, "application/json"
            raise Refused(404, "", "Not found.")
        if rest == "" and method == "PUT":
            return put_index(name, body)
        index = INDEXES.get(name)
        if index is None:
            raise Refused(404, "", f"The index '{name}' for service 'standin' was not found.")
        if rest == "" and method == "GET":
            return 200, index.definition, "application/json"
        if rest == "" and method == "DELETE":
            del INDEXES[name]
            return 204, None, "application/json"
        if rest in ("/docs/search.index", "/docs/index") and method == "POST":
            status, answer = index_batch(index, body.get("value") or [])
            BATCHES.setdefault(name, []).append(len(body.get("value") or []))
            return status, answer, "application/json"
        if rest in ("/docs/search.post.search", "/docs/search") and method == "POST":
            SEARCHES[name] = SEARCHES.get(name, 0) + 1
            answer = search(index, body or {})
            if "@search.nextPageParameters" in answer:
                # As Azure answers a POST: where to send the next page's parameters.
                version = query["api-version"][0]
                answer["@odata.nextLink"] = (f"http://{self.headers.get('Host')}/indexes('{name}')"
                                             f"/docs/search.post.search?api-version={version}")
            return 200, answer, "application/json"
        if rest == "/docs/$count" and method == "GET":
            return 200, str(len(index.docs)), "text/plain"
        if rest in ("/search.stats", "/stats") and method == "GET":
            size = sum(len(json.dumps(d)) for d in index.docs.values()) + index.stored_bytes
            return 200, {"documentCount": len(index.docs), "storageSize": size, "vectorIndexSize": 0}, "application/json"
        if rest in ("/docs/search.post.suggest", "/docs/suggest", "/docs/search.post.autocomplete",
                    "/docs/autocomplete") and method == "POST":
            SEARCHES[name] = SEARCHES.get(name, 0) + 1
            return 200, suggestions(index, body, rest.endswith("autocomplete")), "application/json"
        got = re.fullmatch(r"/docs\('([^']*)'\)|/docs/([^/]+)", rest)
        if got and method == "GET":
            key = unquote(got.group(1) or got.group(2))
            doc = index.docs.get(key)
            if doc is None:
                raise Refused(404, "", "Document not found.")
            return 200, projected(doc, listed(query.get("$select", [None])[0])), "application/json"
        raise Refused(404, "", "Not found.")

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_DELETE(self):
        self.handle_any("DELETE")


def put_index(name, body):
    """Create or update: an update may add fields, never drop or retype one (Azure's 400)."""
    if body.get("name") != name:
        raise Refused(400, "InvalidRequestParameter", "The index name in the body does not match the URL.")
    held = INDEXES.get(name)
    if held is None:
        INDEXES[name] = Index(with_defaults(body))
        return 201, body, "application/json"
    new = {f["name"]: f["type"] for f in body.get("fields", [])}
    for field in held.definition["fields"]:
        if new.get(field["name"]) != field["type"]:
            raise Refused(400, "OperationNotAllowed",
                          f"Existing field '{field['name']}' cannot be changed or removed.")
    held.definition = with_defaults(body)
    return 200, body, "application/json"


def suggestions(index, body, autocomplete):
    suggester = next((s for s in index.definition.get("suggesters", []) if s["name"] == body.get("suggesterName")), None)
    if suggester is None:
        raise Refused(400, "InvalidRequestParameter", "The specified suggester name does not exist in this index.")
    condition = Filter(body["filter"], index) if body.get("filter") else None
    if condition:
        condition.check_fields(condition.tree)
    prefix = body.get("search", "").lower()
    top = body.get("top") or 5
    select = listed(body.get("select"))
    out = []
    for doc in index.docs.values():
        if condition and not condition.matches(doc):
            continue
        for field in suggester["sourceFields"]:
            words = [w for w in re.findall(r"\w+", str(doc.get(field, ""))) if w.lower().startswith(prefix)]
            if words:
                out.append({"text": words[0].lower(), "queryPlusText": words[0].lower()} if autocomplete
                           else {"@search.text": doc.get(field), **projected(doc, select or [index.key])})
                break
    return {"value": out[:top]}


if __name__ == "__main__":
    Handler.key = sys.argv[2]
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
