//! Azure AI Search writes: an index batch decided whole against what the index already holds
//! under each key, and lineage recorded for what it then holds.

use super::*;

impl Call<'_, '_> {
    /// What Azure holds under `keys`: each one's stamp (`None`: held, unstamped), whoever's.
    pub(super) async fn held(
        &self,
        index: &str,
        info: &IndexInfo,
        keys: &[String],
    ) -> Result<Result<BTreeMap<String, Option<lethe_policy::Stamp>>, Answer>, DataError> {
        let body = json!({
            "search": "*",
            "filter": keys_filter(&info.key, keys),
            "select": stamp_select(&info.key).join(","),
            "top": keys.len(),
        });
        let value = match self.own_search(index, body).await? {
            Ok(value) => value,
            Err(refused) => return Ok(Err(refused)),
        };
        let docs = value["value"].as_array().ok_or_else(not_json)?;
        Ok(Ok(docs
            .iter()
            .filter_map(|doc| {
                let key = doc[&info.key].as_str()?.to_owned();
                Some((key, adapter::read_stamp(doc)))
            })
            .collect()))
    }

    /// An indexing batch: decided whole on the stamps Azure holds under its keys, then sent;
    /// lineage follows what Azure says it did, action by action.
    pub(super) async fn batch(
        &self,
        index: &str,
        info: &IndexInfo,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let state = self.upstream.state;
        let tenant = self.ctx.tenant();
        let scope = self.ctx.scope();
        let mut planned = write::plan_batch(body, &info.key, &scope, self.fields.subject)?;
        let keys = planned.keys();
        if !planned.refused.is_empty() {
            return Ok(refused_batch(&keys, &planned.refused));
        }
        let texts = planned.texts(self.fields.text);
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let derivations = state
            .derivation
            .derive(self.ctx, index, &mut planned.facts, String::clone, &texts)
            .await?;
        // The owners of what the write derives from decide it too.
        let owners: Vec<&str> = planned
            .subjects()
            .into_iter()
            .chain(derivations.owners())
            .collect();
        let view = state.policy.view(tenant, owners).await?;
        if let Err(AdapterError::Refused(refused)) = derivations.check(&view, tenant) {
            // A derivation's refusal names its record; the client's batch names its action.
            let refused: Vec<RecordRefusal> = refused
                .into_iter()
                .map(|r| RecordRefusal {
                    index: planned.facts.get(r.index).map_or(r.index, |f| f.index),
                    ..r
                })
                .collect();
            return Ok(refused_batch(&keys, &refused));
        }
        // The stamps Azure holds under these keys decide who owns them, not lineage.
        let held = match self.held(index, info, &keys).await? {
            Ok(held) => held,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let now = crate::now();
        let decided = match write::decide_batch(planned, &scope, &view, &held, now) {
            Err(AdapterError::Refused(refused)) => return Ok(refused_batch(&keys, &refused)),
            decided => decided?,
        };
        let rewritten = derived_before(&held, String::clone);
        let written: Vec<String> = decided.stamps.iter().map(|(k, _)| k.clone()).collect();
        state
            .derivation
            .record(self.ctx, &derivations, &written)
            .await?;
        let azure = match decided.body {
            Some(sent) => match self.sent(index, sent).await? {
                Ok(answer) => Some(answer),
                Err(refused) => return Ok(refused.passed_on()),
            },
            None => None,
        };
        let (status, answer) = write::batch_answer(&decided.order, azure.as_ref())?;
        let done = |key: &str| {
            answer["value"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["key"] == key && r["status"] == true)
        };
        let stamps: Vec<(String, lethe_policy::Stamp)> = decided
            .stamps
            .into_iter()
            .filter(|(key, _)| done(key))
            .collect();
        let kept: Vec<String> = stamps.iter().map(|(k, _)| k.clone()).collect();
        let deleted: Vec<String> = decided.deleted.into_iter().filter(|k| done(k)).collect();
        if !deleted.is_empty() {
            state
                .store
                .mark_items_deleted(&self.upstream.route.name, index, &deleted, now)
                .await?;
        }
        let recorded = self
            .record_written(index, info, stamps, now, Some(&derivations))
            .await;
        let (status, answer, kept) = match recorded {
            Ok(()) => (status, answer, kept),
            Err(e) => self.overtaken(index, info, answer, kept, e).await?,
        };
        state
            .derivation
            .accepted(self.ctx, derivations, &kept, &rewritten)
            .await?;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::MULTI_STATUS);
        Ok(json_response(status, &answer))
    }

    /// Sends a decided batch: Azure's answer (200, or 207 per item), or its refusal of the whole
    /// batch (one too large, say), the client's to hear.
    async fn sent(&self, index: &str, batch: Vec<u8>) -> Result<Result<Value, Answer>, DataError> {
        let path = Self::docs_path(index, "/search.index");
        let answer = self.send(Method::POST, &path, None, batch).await?;
        if !matches!(answer.status.as_u16(), 200 | 207) {
            return Ok(Err(answer));
        }
        Ok(Ok(
            serde_json::from_slice(&answer.body).map_err(|_| not_json())?
        ))
    }

    /// A batch's answer when recording what it wrote failed: when a flip overtook the batch in
    /// flight and what it wrote of the subject was deleted again, those actions are answered as
    /// refused and the others as Azure did them (with the keys still held); any other failure
    /// is the request's.
    async fn overtaken(
        &self,
        index: &str,
        info: &IndexInfo,
        answer: Value,
        kept: Vec<String>,
        failed: DataError,
    ) -> Result<(u16, Value, Vec<String>), DataError> {
        if !failed.status.is_client_error() {
            return Err(failed);
        }
        let Ok(held) = self.held(index, info, &kept).await? else {
            return Err(failed);
        };
        let (kept, gone): (Vec<String>, Vec<String>) =
            kept.into_iter().partition(|k| held.contains_key(k));
        let (status, answer) =
            write::overtaken(answer, &gone, failed.code.as_str(), &failed.message);
        Ok((status, answer, kept))
    }

    /// Lineage of the documents a batch wrote. A document written after a flip of its subject,
    /// or of a subject it derives from (the policy changed while the batch was in flight), is
    /// deleted again.
    pub(super) async fn record_written(
        &self,
        index: &str,
        info: &IndexInfo,
        stamps: Vec<(String, lethe_policy::Stamp)>,
        now: chrono::DateTime<chrono::Utc>,
        derived: Option<&Derivations>,
    ) -> Result<(), DataError> {
        let rows = stamps
            .into_iter()
            .map(|(key, stamp)| {
                ItemRecord::stamped(
                    &self.upstream.route.name,
                    index,
                    key,
                    stamp,
                    now,
                    self.ctx.source.clone(),
                )
            })
            .collect();
        let undo = |overtaken: Vec<ItemRecord>| async move {
            let deletes: Vec<Value> = overtaken
                .iter()
                .map(|r| json!({ "@search.action": "delete", info.key.as_str(): r.item_id }))
                .collect();
            let undone = self
                .send(
                    Method::POST,
                    &Self::docs_path(index, "/search.index"),
                    None,
                    serde_json::to_vec(&json!({ "value": deletes })).unwrap_or_default(),
                )
                .await;
            // Left to the purge, which finds them by stamp and by lineage.
            if undone.is_ok_and(|a| a.status == StatusCode::OK) {
                Vec::new()
            } else {
                overtaken
            }
        };
        keep_unless_overtaken(
            self.upstream.state,
            self.ctx.tenant(),
            rows,
            Recording::Batched,
            derived,
            undo,
        )
        .await
    }
}

/// A refused batch, answered in Azure's per-item shape: nothing of it was sent.
fn refused_batch(keys: &[String], refused: &[RecordRefusal]) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::MULTI_STATUS,
        &write::refused_answer(keys, refused),
    )
}
