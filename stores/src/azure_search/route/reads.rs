//! Azure AI Search reads: searches, lookups, suggestions and counts narrowed to the caller's
//! scope by a filter of Lethe's own, and every document answered decided.

use super::*;

impl Call<'_, '_> {
    pub(super) async fn docs(
        &self,
        index: &str,
        info: &IndexInfo,
        op: Docs,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let query = self.upstream.parts.uri.query().unwrap_or_default();
        let request = |kind: Kind, get: bool| {
            if get {
                read::body_of_query(kind, query)
            } else {
                parse_object(&body)
            }
        };
        match op {
            Docs::Index => self.batch(index, info, &body).await,
            Docs::Search { get } => {
                let client = request(Kind::Search, get)?;
                self.read(index, info, Kind::Search, client).await
            }
            Docs::Suggest { get } => {
                let client = request(Kind::Suggest, get)?;
                self.read(index, info, Kind::Suggest, client).await
            }
            Docs::Autocomplete { get } => {
                let client = request(Kind::Autocomplete, get)?;
                self.read(index, info, Kind::Autocomplete, client).await
            }
            Docs::Count => self.count(index, info).await,
            Docs::Lookup(key) => self.lookup(index, info, &key).await,
        }
    }

    pub(super) fn reader(&self) -> Reader<'_> {
        Reader {
            tenant: self.ctx.tenant(),
            subject: self.ctx.subject.as_deref(),
            purpose: self.ctx.purpose.as_deref(),
        }
    }

    /// Azure's answer as JSON, with the policy of the caller's tenant's subjects in it.
    pub(super) async fn answer_and_view(
        &self,
        answer: &Answer,
    ) -> Result<(Value, crate::data::policy_cache::View), DataError> {
        let value: Value = serde_json::from_slice(&answer.body).map_err(|_| not_json())?;
        let view = self
            .upstream
            .state
            .policy
            .view_of_owners(self.ctx.tenant(), &read::owners(&value))
            .await?;
        Ok((value, view))
    }

    /// What the caller may read in `scope` (the narrowed filter), as a filter Azure computes
    /// over: the policy of the subjects in the scope (the bound one, or those a facet of the
    /// scope names), and the keys an erasure's closure hides. One search at most before the
    /// read; Azure's answer when it refuses it.
    pub(super) async fn readable_filter(
        &self,
        index: &str,
        info: &IndexInfo,
        scope: &str,
    ) -> Result<Result<String, Answer>, DataError> {
        let subjects = match self.ctx.subject.as_deref() {
            Some(subject) => vec![subject.to_owned()],
            None => match self.subjects_in(index, info, scope).await? {
                Ok(subjects) => subjects,
                Err(refused) => return Ok(Err(refused)),
            },
        };
        let tenant = self.ctx.tenant();
        let view = self
            .upstream
            .state
            .policy
            .view(tenant, subjects.iter().map(String::as_str))
            .await?;
        let hidden = view.hidden_ids(&self.ctx.store, index);
        let readable =
            readable::readable(tenant, &subjects, &view, &info.key, &hidden, crate::now());
        Ok(Ok(format!("({scope}) and ({readable})")))
    }

    /// The subjects whose documents are in `scope`, from a facet of Azure's on the stamp's
    /// subject; refused past [`readable::MAX_SUBJECTS`].
    pub(super) async fn subjects_in(
        &self,
        index: &str,
        info: &IndexInfo,
        scope: &str,
    ) -> Result<Result<Vec<String>, Answer>, DataError> {
        if !info.subjects_facetable {
            return Err(invalid(
                "this index was created before Lethe counted by subject: counts, facets and autocomplete need a caller bound to one subject; recreate the index through Lethe to serve them to others",
            ));
        }
        let query = json!({
            "search": "*",
            "filter": scope,
            "top": 0,
            "facets": [readable::subjects_facet()],
        });
        let value = match self.own_search(index, query).await? {
            Ok(value) => value,
            Err(refused) => return Ok(Err(refused)),
        };
        let facets = value
            .pointer(&format!("/@search.facets/{}", adapter::SUBJECT))
            .and_then(Value::as_array)
            .ok_or_else(not_json)?;
        if facets.len() > readable::MAX_SUBJECTS {
            return Err(invalid(format!(
                "the caller's scope holds documents of more than {} subjects: bind the token to one, or narrow the filter",
                readable::MAX_SUBJECTS
            )));
        }
        facets
            .iter()
            .map(|f| f.get("value").and_then(Value::as_str).map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Ok)
            .ok_or_else(not_json)
    }

    /// A search, suggest or autocomplete: narrowed, and its answer decided again.
    pub(super) async fn read(
        &self,
        index: &str,
        info: &IndexInfo,
        kind: Kind,
        client: serde_json::Map<String, Value>,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let plan: Read = read::plan_read(kind, client, self.reader(), crate::now())?;
        let filter = match plan.computes_over_documents() {
            true => match self.readable_filter(index, info, plan.filter()).await? {
                Ok(filter) => filter,
                Err(refused) => return Ok(refused.passed_on()),
            },
            false => plan.filter().to_owned(),
        };
        let op = match kind {
            Kind::Search => "/search.post.search",
            Kind::Suggest => "/search.post.suggest",
            Kind::Autocomplete => "/search.post.autocomplete",
        };
        let answer = self
            .send(
                Method::POST,
                &Self::docs_path(index, op),
                None,
                plan.body(&info.key, &filter),
            )
            .await?;
        if !answer.is_success() {
            return Ok(answer.passed_on());
        }
        let (value, view) = self.answer_and_view(&answer).await?;
        let (ctx, now) = (self.ctx.read_context(), crate::now());
        // Whose each served document is, read before the answer is cut to what the client
        // asked for; only when lineage remembers what is served (autocomplete serves terms).
        let remembered = self.upstream.state.derivation.enabled() && kind != Kind::Autocomplete;
        let owners: Vec<Option<(String, String)>> = match remembered {
            true => value["value"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|doc| read::readable(doc, index, &info.key, &view, &ctx, now))
                .map(|doc| owner(doc, &info.key))
                .collect(),
            false => Vec::new(),
        };
        let decided = plan.decide(value, index, &info.key, &view, &ctx, now)?;
        if remembered {
            let reached = decided["value"].as_array().map_or(&[][..], Vec::as_slice);
            self.remember_served(index, owners, reached).await?;
        }
        Ok(json_response(answer.status, &decided))
    }

    /// Remembers the documents an answer serves (each one's key and owner, and the document as
    /// it reached the client, in the same order), for what the caller derives from them.
    pub(super) async fn remember_served(
        &self,
        index: &str,
        owners: Vec<Option<(String, String)>>,
        reached: &[Value],
    ) -> Result<(), DataError> {
        let served = owners
            .into_iter()
            .zip(reached)
            .filter_map(|(owner, reached)| {
                let (id, owner) = owner?;
                Some(Served {
                    collection: index.to_owned(),
                    id,
                    owner,
                    text: text_of_fields(reached.as_object(), self.fields.text),
                    answer: false,
                })
            })
            .collect();
        self.upstream
            .state
            .derivation
            .served(self.ctx, served)
            .await
    }

    /// `$count`: how many documents the caller may see, never how many the index holds.
    pub(super) async fn count(
        &self,
        index: &str,
        info: &IndexInfo,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let scope =
            adapter::narrowed(None, self.reader(), crate::now()).map_err(|e| invalid(e.0))?;
        let filter = match self.readable_filter(index, info, &scope).await? {
            Ok(filter) => filter,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let visible = match self.counted(index, &filter).await? {
            Ok(visible) => visible,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let mut response = Response::new(Full::new(Bytes::from(visible.to_string())));
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain"),
        );
        Ok(response)
    }

    /// `docs('key')`: the document, when the caller may see it; otherwise Azure's answer for a
    /// key it does not hold.
    pub(super) async fn lookup(
        &self,
        index: &str,
        info: &IndexInfo,
        key: &str,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let (sent, select) = read::lookup_select(self.upstream.parts.uri.query(), &info.key)?;
        let extra = sent.map(|s| {
            form_urlencoded::Serializer::new(String::new())
                .append_pair("$select", &s)
                .finish()
        });
        let answer = self
            .send(
                Method::GET,
                &Self::docs_path(index, &format!("('{key}')")),
                extra.as_deref(),
                Vec::new(),
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(no_document());
        }
        if !answer.is_success() {
            return Ok(answer.passed_on());
        }
        let (doc, view) = self.answer_and_view(&answer).await?;
        let (ctx, now) = (self.ctx.read_context(), crate::now());
        if !read::readable(&doc, index, &info.key, &view, &ctx, now) {
            return Ok(no_document());
        }
        let owners = vec![owner(&doc, &info.key)];
        let reached = read::cut_document(doc, select.as_deref());
        self.remember_served(index, owners, std::slice::from_ref(&reached))
            .await?;
        Ok(json_response(StatusCode::OK, &reached))
    }
}
