"""The replica state machine of one partition (replication/replica_state.py), driven with
explicit times: ``now_ms`` is a plain integer, so every lag-time rule is checked at its
exact boundary without sleeping."""
from hypothesis import given, strategies as st

from replication.replica_state import EpochCache, LeaderState, choose_leader, truncation_point
from replication.tree import children_of, promote

LAG = 10_000        # replica.lag.time.max.ms
T0 = 5_000_000      # a monotonic clock that has been running for a while


def leader(children=(2, 3), isr=(1, 2, 3), now=T0, new_epoch=True) -> LeaderState:
    """Node 1 leading with direct children ``children`` and committed ISR ``isr``."""
    s = LeaderState(1, LAG)
    s.reset(list(children), list(isr), new_epoch=new_epoch, now_ms=now)
    return s


# -- ISR shrink and expand ------------------------------------------------------------------

def test_child_that_stops_fetching_leaves_the_proposed_isr_after_the_lag_time():
    s = leader()
    s.record_fetch(2, 100, 100, T0 + 1_000)
    s.record_fetch(3, 100, 100, T0 + 1_000)      # 3 fetches once, caught up, then goes silent
    for t in range(T0 + 2_000, T0 + 3 * LAG, 1_000):
        s.record_fetch(2, 100, 100, t)           # 2 keeps fetching at the log end
    assert s.proposed_isr(T0 + 1_000 + LAG) == [1, 2, 3]       # exactly the lag time: still in
    assert s.proposed_isr(T0 + 1_000 + LAG + 1) == [1, 2]      # one ms later: out
    assert s.proposed_isr(T0 + 3 * LAG) == [1, 2]


def test_child_fetching_behind_a_busy_leader_stays_in_the_isr():
    # Every fetch reaches the log end the leader had at the previous fetch, but the leader
    # appended meanwhile, so no single fetch reaches the current log end. Kafka counts such
    # a follower as caught up (as of its previous fetch); dropping it would shrink the ISR
    # of every partition under steady produce load.
    s = leader(children=[2], isr=[1, 2])
    leo = 100
    fetch_offset = 0
    for t in range(T0, T0 + 10 * LAG, 500):
        s.record_fetch(2, fetch_offset, leo, t)
        fetch_offset, leo = leo, leo + 50         # next fetch asks for what the leader had
        assert s.proposed_isr(t) == [1, 2]
    assert s.proposed_isr(T0 + 10 * LAG) == [1, 2]


def test_child_falling_further_behind_leaves_the_isr():
    # Contrast with the busy-leader case: here each fetch stays below the leader's log end
    # as of the previous fetch, so the follower never catches up and drops out after the lag.
    s = leader(children=[2], isr=[1, 2])
    s.record_fetch(2, 100, 100, T0)               # caught up once at T0
    leo = 100
    for i, t in enumerate(range(T0 + 500, T0 + 3 * LAG, 500)):
        leo += 100
        s.record_fetch(2, 100 + i, leo, t)        # crawls forward, never reaches the old log end
    assert s.proposed_isr(T0 + LAG) == [1, 2]
    assert s.proposed_isr(T0 + LAG + 1) == [1]


def test_child_that_catches_up_is_proposed_again():
    s = leader()
    s.record_fetch(2, 50, 50, T0)
    s.record_fetch(3, 10, 50, T0)                 # behind
    later = T0 + LAG + 1
    s.record_fetch(2, 50, 50, later)
    assert s.proposed_isr(later) == [1, 2]        # 3 never caught up: out once the grace ends
    s.reset([2, 3], [1, 2], new_epoch=False, now_ms=later)   # the store accepted the shrink
    s.record_fetch(3, 40, 50, later + 10)          # still behind: stays out
    assert s.proposed_isr(later + 10) == [1, 2]
    s.record_fetch(3, 50, 50, later + 20)          # reaches the log end
    assert s.proposed_isr(later + 20) == [1, 2, 3]  # tree order, not arrival order


def test_isr_proposal_is_in_tree_order():
    s = leader(children=[3, 2], isr=[1])
    s.record_fetch(2, 10, 10, T0)
    s.record_fetch(3, 10, 10, T0 + 1)
    assert s.proposed_isr(T0 + 1) == [1, 3, 2]


# -- a new leader's grace ------------------------------------------------------------------

def test_new_leader_keeps_committed_isr_members_for_the_lag_time_before_their_first_fetch():
    s = leader(children=[2, 3, 4], isr=[1, 2, 3])
    assert s.proposed_isr(T0) == [1, 2, 3]            # 4 is no ISR member: no grace
    assert s.proposed_isr(T0 + LAG) == [1, 2, 3]
    assert s.proposed_isr(T0 + LAG + 1) == [1]
    s.record_fetch(4, 0, 0, T0 + 5)                   # a non-member that catches up joins
    assert s.proposed_isr(T0 + 5) == [1, 2, 3, 4]


def test_grace_counts_from_the_leadership_start_not_from_a_fetch_that_was_behind():
    s = leader(children=[2], isr=[1, 2])
    s.record_fetch(2, 0, 500, T0 + 1_000)            # fetched, but behind: grace still applies
    assert s.proposed_isr(T0 + LAG) == [1, 2]
    assert s.proposed_isr(T0 + LAG + 1) == [1]


def test_first_reset_starts_the_leadership_even_at_an_unchanged_epoch():
    # A broker creates a partition as its own leader at epoch 0 before the store's first
    # assignment arrives; when the store then says "you lead epoch 0", the epoch has not
    # changed, but the leadership (and the children's grace) starts only now.
    s = leader(now=T0, new_epoch=False)
    assert s.proposed_isr(T0 + 1) == [1, 2, 3]
    assert s.proposed_isr(T0 + LAG + 1) == [1]


def test_new_epoch_forgets_what_children_told_an_earlier_leadership():
    s = leader(children=[2], isr=[1, 2])
    s.record_fetch(2, 100, 100, T0)
    t1 = T0 + 5 * LAG
    s.reset([2], [1, 2], new_epoch=True, now_ms=t1)
    assert s.high_watermark(100) == -1              # 2 must fetch from this leadership first
    assert s.proposed_isr(t1 + LAG) == [1, 2]       # grace from t1, not from the old fetch
    assert s.proposed_isr(t1 + LAG + 1) == [1]


def test_isr_change_at_the_same_epoch_keeps_follower_state():
    s = leader(children=[2, 3], isr=[1, 2, 3])
    s.record_fetch(2, 70, 100, T0 + 1)
    s.reset([2, 3], [1, 2], new_epoch=False, now_ms=T0 + 2)
    assert s.high_watermark(100) == 70


def test_child_removed_from_the_tree_is_forgotten():
    s = leader(children=[2, 3], isr=[1, 2, 3])
    s.record_fetch(3, 100, 100, T0)
    s.reset([2], [1, 2], new_epoch=False, now_ms=T0 + 1)
    assert 3 not in s.followers
    assert not s.record_fetch(3, 100, 100, T0 + 2)


# -- high watermark over the committed ISR ---------------------------------------------------

def test_proposed_shrink_does_not_move_the_high_watermark():
    s = leader()
    s.record_fetch(3, 40, 100, T0 + 1)                   # 3 got to 40, then went silent
    for t in range(T0 + 1, T0 + 2 * LAG, 1_000):
        s.record_fetch(2, 100, 100, t)
    now = T0 + 2 * LAG
    assert s.proposed_isr(now) == [1, 2]
    assert s.high_watermark(100) == 40                   # the store has not accepted the shrink
    s.reset([2, 3], [1, 2], new_epoch=False, now_ms=now)  # now it has
    assert s.high_watermark(100) == 100


def test_member_that_never_fetched_holds_the_high_watermark():
    s = leader()
    s.record_fetch(2, 50, 80, T0 + 1)
    assert s.high_watermark(80) == -1                    # 3 unknown: nothing is committed yet
    s.record_fetch(3, 30, 80, T0 + 2)
    assert s.high_watermark(80) == 30
    s.record_fetch(3, 80, 80, T0 + 3)
    assert s.high_watermark(80) == 50


def test_high_watermark_ignores_children_outside_the_committed_isr():
    s = leader(children=[2, 3], isr=[1, 2])
    s.record_fetch(2, 90, 100, T0 + 1)
    s.record_fetch(3, 5, 100, T0 + 1)
    assert s.high_watermark(100) == 90


def test_high_watermark_of_a_leader_alone_in_its_isr_is_its_log_end():
    s = leader(children=[2, 3], isr=[1])
    assert s.high_watermark(123) == 123


def test_high_watermark_never_exceeds_the_leader_log_end():
    s = leader(children=[2], isr=[1, 2])
    s.record_fetch(2, 200, 100, T0)                     # a follower with a longer (divergent) log
    assert s.high_watermark(100) == 100


def test_fetch_from_a_non_child_is_ignored():
    s = leader(children=[2, 3], isr=[1, 2, 3])
    assert not s.record_fetch(4, 100, 100, T0)          # a grandchild fetches from 2, not from us
    assert not s.record_fetch(9, 100, 100, T0)          # not a replica at all
    assert s.followers.keys() == set()
    assert s.proposed_isr(T0 + LAG + 1) == [1]
    assert s.record_fetch(2, 100, 100, T0)


# -- epochs and truncation points ---------------------------------------------------------------

def cache(*entries) -> EpochCache:
    c = EpochCache()
    for epoch, start in entries:
        c.note(epoch, start)
    return c


def test_note_keeps_the_first_offset_of_each_epoch():
    c = cache((2, 6), (2, 7), (-1, 8), (1, 9), (4, 11))
    assert c.entries == [(2, 6), (4, 11)]   # repeats, the undefined epoch and older epochs ignored
    assert c.latest() == 4
    assert EpochCache().latest() == -1


# The cases of Kafka's LeaderEpochFileCacheTest that canopy answers as Kafka does.
def test_end_offset_of_the_latest_epoch_is_the_log_end():
    assert cache((2, 10)).end_offset_for(2, 11) == (2, 11)
    assert cache((2, 11)).end_offset_for(2, 14) == (2, 14)
    assert cache((2, 6)).end_offset_for(2, 7) == (2, 7)


def test_end_offset_for_the_undefined_epoch_is_undefined():
    assert cache((2, 11), (3, 12)).end_offset_for(-1, 0) == (-1, -1)
    assert EpochCache().end_offset_for(-1, 73) == (-1, -1)


def test_end_offset_for_an_epoch_older_than_the_first_is_the_first_start():
    assert cache((5, 11), (6, 12), (7, 13)).end_offset_for(4, 0) == (4, 11)


def test_end_offset_of_an_earlier_epoch_is_where_the_next_one_starts():
    c = cache((1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16))
    assert c.end_offset_for(2, 17) == (2, 15)
    assert c.end_offset_for(1, 17) == (1, 13)


def test_end_offset_for_an_epoch_between_known_ones_is_that_of_the_floor_epoch():
    c = cache((0, 10), (2, 13), (4, 17))
    assert c.end_offset_for(1, 0) == (0, 13)
    assert c.end_offset_for(2, 0) == (2, 17)
    assert c.end_offset_for(3, 0) == (2, 17)


def test_end_offsets_as_leaders_change_many_times():
    c = cache((0, 0), (1, 0))
    assert c.end_offset_for(1, 0) == (1, 0)
    assert c.end_offset_for(0, 0) == (0, 0)
    assert c.end_offset_for(1, 5) == (1, 5)
    c.note(2, 5)
    assert c.end_offset_for(2, 10) == (2, 10)
    assert c.end_offset_for(1, 10) == (1, 5)
    assert c.end_offset_for(0, 10) == (0, 0)


# Where canopy deliberately differs from Kafka.
def test_end_offset_for_an_epoch_newer_than_any_known_is_the_log_end_of_the_latest():
    # Kafka answers UNDEFINED (its followers only ask the leader, whose epoch is never
    # older). In a tree the upstream may be a follower that has not yet received the
    # newest epoch's batches; (latest epoch, log end) makes the child cut back to what
    # its upstream holds and re-fetch, instead of fetching past the upstream's log end.
    assert cache((2, 100)).end_offset_for(3, 100) == (2, 100)
    assert cache((0, 0), (4, 40)).end_offset_for(9, 55) == (4, 55)


def test_leader_current_epoch_counts_even_before_its_first_batch():
    # A leader's own epoch may have no batch in the log yet; it is still the latest epoch.
    c = cache((0, 0), (2, 10))
    assert c.end_offset_for(3, 25, current_epoch=3) == (3, 25)
    assert c.end_offset_for(5, 25, current_epoch=3) == (3, 25)


def test_end_offset_of_the_last_logged_epoch_under_a_newer_current_epoch_is_the_log_end():
    # The leader's current epoch 3 has no batch and no entry yet, so epoch 2 has not ended:
    # the answer is epoch 2 (the largest <= the one asked, never a newer one) up to the log end.
    c = cache((0, 0), (2, 10))
    assert c.end_offset_for(2, 25, current_epoch=3) == (2, 25)
    assert c.end_offset_for(1, 25, current_epoch=3) == (0, 10)
    assert EpochCache().end_offset_for(1, 25, current_epoch=3) == (1, 25)


def test_truncation_point_without_an_answer_keeps_the_log():
    own = cache((0, 0), (1, 50))
    assert truncation_point(own, 80, -1, -1) == 80


def test_truncation_point_in_the_same_epoch_is_the_upstream_end_capped_at_our_log_end():
    own = cache((0, 0), (1, 50))
    assert truncation_point(own, 80, 1, 60) == 60      # we hold 20 records the upstream lacks
    assert truncation_point(own, 80, 1, 100) == 80     # the upstream is ahead: nothing to cut


def test_truncation_point_when_the_upstream_common_epoch_is_older():
    # KIP-279: we led epoch 3 and wrote 70..89 that nobody replicated. The new leader never
    # saw epoch 3; for it, epoch 1 ran until 75. Our epoch-1 records end at 70 (where our
    # epoch 3 began), so everything from 70 on is divergent even though 70 < 75.
    own = cache((0, 0), (1, 50), (3, 70))
    assert truncation_point(own, 90, 1, 75) == 70
    # If the upstream's common epoch ended earlier than ours, its end wins.
    assert truncation_point(own, 90, 1, 60) == 60
    # An upstream that knows nothing older than our first epoch: cut at its answer.
    assert truncation_point(cache((3, 70)), 90, 2, 30) == 30


# -- election ------------------------------------------------------------------------------------

def test_election_picks_the_first_live_isr_member_in_tree_order():
    e = choose_leader([1, 3, 2, 4], [1, 2, 3], {2, 3, 4}, unclean=False)
    assert (e.leader, e.isr, e.clean) == (3, [3, 2], True)


def test_election_without_a_live_isr_member_finds_nobody():
    assert choose_leader([1, 2, 3], [1, 2], {3}, unclean=False) is None
    assert choose_leader([1, 2, 3], [1, 2, 3], set(), unclean=True) is None


def test_unclean_election_picks_an_out_of_sync_live_replica_only_when_enabled():
    e = choose_leader([1, 2, 3, 4], [1, 2], {3, 4}, unclean=True)
    assert (e.leader, e.isr, e.clean) == (3, [3], False)
    # Enabled but a clean candidate exists: the clean one wins.
    e = choose_leader([1, 3, 2], [1, 2], {2, 3}, unclean=True)
    assert (e.leader, e.isr, e.clean) == (2, [2], True)


def test_new_isr_excludes_dead_members_and_the_old_leader():
    e = choose_leader([1, 2, 3, 4, 5], [1, 2, 3, 4], {2, 4, 5}, unclean=False)
    assert (e.leader, e.isr) == (2, [2, 4])
    assert 1 not in e.isr and 3 not in e.isr and 5 not in e.isr


replica_sets = st.lists(st.integers(0, 12), min_size=1, max_size=9, unique=True)


@st.composite
def partitions(draw):
    replicas = draw(replica_sets)
    fanout = draw(st.integers(1, 4))
    # Only the leader's direct children are ever proposed into the ISR.
    candidates = children_of(replicas, replicas[0], fanout)
    isr = [replicas[0], *[c for c in candidates if draw(st.booleans())]]
    live = {r for r in replicas if draw(st.booleans())} - {replicas[0]}   # the leader died
    live |= draw(st.sets(st.integers(13, 20), max_size=2))   # brokers hosting no replica
    return replicas, fanout, isr, live, draw(st.booleans())


@given(partitions())
def test_elected_leader_is_live_and_clean_elections_stay_in_the_isr(p):
    replicas, fanout, isr, live, unclean = p
    e = choose_leader(replicas, isr, live, unclean)
    live_isr = [r for r in replicas if r in isr and r in live]
    if e is None:
        assert not live_isr and (not unclean or not live & set(replicas))
        return
    assert e.leader in live and e.leader in replicas
    assert e.isr[0] == e.leader and set(e.isr) <= live
    if e.clean:
        assert e.leader == live_isr[0] and set(e.isr) <= set(isr)
        # Re-rooted the way the controller does it, the surviving ISR members are direct
        # children of the new leader: the ISR invariant holds in the new tree too.
        tree = promote(replicas, e.leader, demoted=replicas[0])
        assert set(e.isr[1:]) <= set(children_of(tree, e.leader, fanout))
    else:
        assert unclean and not live_isr and e.isr == [e.leader]
