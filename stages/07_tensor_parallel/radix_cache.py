"""The prefix cache: KV pages that earlier requests computed, found again by their tokens.

A radix tree over token ids (SGLang's RadixAttention). Each node holds a run of tokens and the KV
pages that hold them; the path from the root to a node spells a prefix. A new prompt walks down
the tree as far as it agrees with it and reuses those pages instead of recomputing them.

With pages of more than one token the tree works in whole pages: a page is shared only when all
its tokens match, so match lengths round down to a page and only full pages are inserted.

Nodes that live requests use are locked (reference counts up to the root); when the allocator
runs dry, unlocked leaves are evicted, least recently used first. The tree never touches the
allocator itself: `evict` and `insert` say which pages to free, and the caller frees them. This
file imports nothing from the rest of the engine.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence


class TreeNode:
    __slots__ = ("key", "pages", "children", "parent", "lock_ref", "last_access", "order")
    _counter = itertools.count()

    def __init__(self, key: list[int], pages: list[int], parent: TreeNode | None, last_access: int = 0):
        self.key = key  # the tokens on the edge into this node: a whole number of pages
        self.pages = pages  # pages[i] holds the K and V of key[i * page_size : (i + 1) * page_size]
        self.children: dict[tuple[int, ...], TreeNode] = {}  # by the first page of their key
        self.parent = parent
        self.lock_ref = 0  # live requests whose prefix runs through this node
        self.last_access = last_access
        self.order = next(TreeNode._counter)  # breaks ties in the eviction heap, deterministically

    @property
    def is_leaf(self) -> bool:
        return not self.children


Handle = TreeNode | None  # what `match` and `insert` give back, to lock and unlock later


class PrefixCache(ABC):
    """What the scheduler needs from a prefix cache; `NaiveCache` and `RadixCache` implement it."""

    reuses_prefixes = False

    def __init__(self, page_size: int):
        self.page_size = page_size

    @abstractmethod
    def match(self, token_ids: Sequence[int]) -> tuple[list[int], Handle]:
        """The pages of the longest cached prefix of `token_ids` (whole pages), and its handle."""

    @abstractmethod
    def lock(self, handle: Handle) -> None:
        """A request uses the prefix ending at `handle`: none of its pages may be evicted."""

    @abstractmethod
    def unlock(self, handle: Handle) -> None: ...

    @abstractmethod
    def insert(self, token_ids: Sequence[int], pages: list[int]) -> tuple[list[int], Handle]:
        """Offer the pages holding the KV of `token_ids` (whole pages only). Returns the pages the
        cache now holds for them (its own where it already had them) and the handle of their end.
        An offered page that differs from the returned one is a duplicate: the caller frees it."""

    @abstractmethod
    def evict(self, num_pages: int) -> list[int]:
        """Drop at least `num_pages` unlocked pages if there are that many; return the dropped
        pages, which the caller frees."""

    @property
    @abstractmethod
    def evictable_pages(self) -> int: ...

    @abstractmethod
    def prefix(self, handle: Handle) -> tuple[list[int], list[int]]:
        """The tokens and pages of the prefix that ends at `handle` (read only: no LRU update)."""

    @abstractmethod
    def all_pages(self) -> list[int]:
        """Every page the cache holds, locked or not."""

    @abstractmethod
    def check_integrity(self, locks: Iterable[Handle]) -> None:
        """Raise AssertionError unless the cache is consistent and `locks` are all the locks held."""


class NaiveCache(PrefixCache):
    """Stage 02's behaviour (`--cache naive`): nothing is ever matched or kept."""

    def match(self, token_ids: Sequence[int]) -> tuple[list[int], Handle]:
        return [], None

    def lock(self, handle: Handle) -> None:
        pass

    def unlock(self, handle: Handle) -> None:
        pass

    def insert(self, token_ids: Sequence[int], pages: list[int]) -> tuple[list[int], Handle]:
        return [], None  # keeps nothing: the request still owns all its pages

    def evict(self, num_pages: int) -> list[int]:
        return []

    @property
    def evictable_pages(self) -> int:
        return 0

    def prefix(self, handle: Handle) -> tuple[list[int], list[int]]:
        return [], []

    def all_pages(self) -> list[int]:
        return []

    def check_integrity(self, locks: Iterable[Handle]) -> None:
        assert all(h is None for h in locks), "the naive cache hands out no handles"


def _common_length(key: list[int], tokens: list[int], start: int, page_size: int) -> int:
    """How many tokens `key` and `tokens[start:]` share, rounded down to whole pages."""
    n = min(len(key), len(tokens) - start)
    if key[:n] == tokens[start : start + n]:  # the usual case, compared in C
        same = n
    else:
        same = 0
        while key[same] == tokens[start + same]:
            same += 1
    return same - same % page_size


class RadixCache(PrefixCache):
    reuses_prefixes = True

    def __init__(self, page_size: int):
        super().__init__(page_size)
        self.root = TreeNode([], [], None)
        self.clock = itertools.count(1)  # a logical clock for LRU: deterministic, unlike time
        self.num_evictable = 0  # pages in unlocked nodes
        self.num_locked = 0  # pages in locked nodes

    def _edge(self, tokens: list[int], pos: int) -> tuple[int, ...]:
        return tuple(tokens[pos : pos + self.page_size])

    def _whole_pages(self, token_ids: Sequence[int]) -> list[int]:
        return list(token_ids[: len(token_ids) - len(token_ids) % self.page_size])

    # --8<-- [start:match]
    def match(self, token_ids: Sequence[int]) -> tuple[list[int], Handle]:
        tokens = self._whole_pages(token_ids)
        now = next(self.clock)
        node, pos, pages = self.root, 0, []
        while pos < len(tokens):
            child = node.children.get(self._edge(tokens, pos))
            if child is None:
                break
            same = _common_length(child.key, tokens, pos, self.page_size)
            if same < len(child.key):
                # The prompt leaves this edge part way: split it, so that the match ends at a
                # node and locking that node locks exactly the matched pages.
                child = self._split(child, same)
            child.last_access = now
            pages += child.pages
            pos += same
            node = child
        return pages, node

    # --8<-- [end:match]

    # --8<-- [start:split]
    def _split(self, node: TreeNode, length: int) -> TreeNode:
        """Cut `node`'s edge after `length` tokens (a whole number of pages); return the new upper
        half, which takes the node's place under its parent."""
        cut = length // self.page_size
        assert node.parent is not None and 0 < cut < len(node.pages)
        upper = TreeNode(node.key[:length], node.pages[:cut], node.parent, node.last_access)
        upper.lock_ref = node.lock_ref  # every lock through the node runs through its upper half
        node.parent.children[self._edge(upper.key, 0)] = upper
        node.key, node.pages, node.parent = node.key[length:], node.pages[cut:], upper
        upper.children[self._edge(node.key, 0)] = node
        return upper

    # --8<-- [end:split]

    # --8<-- [start:insert]
    def insert(self, token_ids: Sequence[int], pages: list[int]) -> tuple[list[int], Handle]:
        tokens = self._whole_pages(token_ids)[: len(pages) * self.page_size]
        pages = pages[: len(tokens) // self.page_size]
        now = next(self.clock)
        node, pos, held = self.root, 0, []
        while pos < len(tokens):
            edge = self._edge(tokens, pos)
            child = node.children.get(edge)
            if child is None:  # the rest is new: one leaf takes the offered pages
                child = TreeNode(tokens[pos:], pages[pos // self.page_size :], node, now)
                node.children[edge] = child
                self.num_evictable += len(child.pages)
                held += child.pages
                return held, child
            same = _common_length(child.key, tokens, pos, self.page_size)
            if same < len(child.key):
                child = self._split(child, same)
            # Already cached (by this request's own match, or by another request that computed
            # the same tokens meanwhile): the cache's pages win, the offered ones are duplicates.
            child.last_access = now
            held += child.pages
            pos += same
            node = child
        return held, node

    # --8<-- [end:insert]

    # --8<-- [start:lock]
    def lock(self, handle: Handle) -> None:
        node = handle
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self.num_evictable -= len(node.pages)
                self.num_locked += len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: Handle) -> None:
        node = handle
        while node is not None and node is not self.root:
            assert node.lock_ref > 0, "unlocking a node that is not locked"
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.num_evictable += len(node.pages)
                self.num_locked -= len(node.pages)
            node = node.parent

    # --8<-- [end:lock]

    # --8<-- [start:evict]
    def evict(self, num_pages: int) -> list[int]:
        # Only unlocked leaves go: a locked node serves a live request, and an inner node's pages
        # are the prefix of its children's. A parent whose last child goes becomes a candidate.
        heap = [(n.last_access, n.order, n) for n in self._nodes() if n.is_leaf and n.lock_ref == 0]
        heapq.heapify(heap)
        freed: list[int] = []
        while heap and len(freed) < num_pages:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[self._edge(node.key, 0)]
            self.num_evictable -= len(node.pages)
            freed += node.pages
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.order, parent))
        return freed

    # --8<-- [end:evict]

    @property
    def evictable_pages(self) -> int:
        return self.num_evictable

    def _nodes(self) -> Iterator[TreeNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def prefix(self, handle: Handle) -> tuple[list[int], list[int]]:
        path = []
        node = handle
        while node is not None and node is not self.root:
            path.append(node)
            node = node.parent
        path.reverse()
        return [t for n in path for t in n.key], [p for n in path for p in n.pages]

    def all_pages(self) -> list[int]:
        return [p for node in self._nodes() for p in node.pages]

    def check_integrity(self, locks: Iterable[Handle]) -> None:
        expected: dict[int, int] = {}  # id(node) -> locks through it
        for handle in locks:
            node = handle
            while node is not None and node is not self.root:
                expected[id(node)] = expected.get(id(node), 0) + 1
                node = node.parent
        evictable = locked = 0
        pages = self.all_pages()
        assert len(pages) == len(set(pages)), "a page is in the tree twice"
        for node in self._nodes():
            assert node.pages and len(node.key) == len(node.pages) * self.page_size, "key and pages disagree"
            assert node.parent is not None and node.parent.children.get(self._edge(node.key, 0)) is node
            assert node.lock_ref == expected.get(id(node), 0), "a lock count is off"
            if node.lock_ref:
                locked += len(node.pages)
            else:
                evictable += len(node.pages)
        assert (evictable, locked) == (self.num_evictable, self.num_locked), "page counts are off"


CACHES: dict[str, type[PrefixCache]] = {"radix": RadixCache, "naive": NaiveCache}
