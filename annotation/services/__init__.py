"""Annotation services (what changes state), one module per concern; reads are in
annotation/selectors.py. Import from the module that defines a name:

- `errors`: `AnnotationError`, the one refusal every service raises (its HTTP status and field);
- `leases`: who holds which pair: `assignment_next` (the next pair, leased), the order pairs come
  in, lease expiry and reclaim, the blind payload, skips and their undo;
- `campaigns`: creating a campaign, its bounds and guidelines, its assignees, closing and reopening;
- `ratings`: the typed rating payload (`RatingPayload`, `Draft`), submit, revision and drafts;
- `reports`: the campaign report (statistics cached per campaign) and recording its verdicts on
  the benchmark;
- `demo`: the demo annotators' ratings for `seed_demo`.

Concurrency: a pair's `taken` (live leases + submitted ratings) only changes through
conditional UPDATEs (`taken < overlap`, leases.take_slot), so however many annotators ask at
once no pair is ever held or finished by more than `overlap` people.
"""
