//! Prefix sharing: full pages are identified by their token content (the tokens of the page and of every page
//! before it: a hash chain, with each page's own tokens kept to rule out collisions), so every sequence that
//! starts with the same tokens reads the same pages instead of recomputing them. A page's state depends only on
//! the tokens up to its end, so a full page is immutable and safe to share; a sequence only ever writes after
//! its shared prefix, into pages of its own (the prefix matched is whole pages, so no page is ever copied).
//!
//! The cache holds one reference on each page it knows ([`PagePool::retain`]). Pages nobody else holds are
//! evicted least recently used first when the pool runs short ([`PrefixCache::evict`]); pages a live sequence
//! reads are never evicted (their holders are above one).

use super::pages::PagePool;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The chain hash of a page whose predecessor's chain hash is `parent` and whose tokens are `block`.
pub fn chain(parent: u64, block: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    block.hash(&mut h);
    h.finish()
}

#[derive(Debug)]
struct Entry {
    page: u32,
    parent: u64,
    block: Vec<u32>,
    last_used: u64,
}

/// The pages of token prefixes, by chain hash.
#[derive(Debug, Default)]
pub struct PrefixCache {
    map: HashMap<u64, Entry>,
    clock: u64,
}

/// The chain hash of the empty prefix.
pub const ROOT: u64 = 0x6c6f_6f6d_7072_6566;

impl PrefixCache {
    /// Pages the cache knows.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The cached pages of the longest prefix of `tokens` made of whole pages of `page_tokens`, at most
    /// `max_pages` of them, each retained once more for the caller, with the chain hash after each.
    pub fn lookup(
        &mut self,
        pool: &mut PagePool,
        tokens: &[u32],
        page_tokens: u32,
        max_pages: usize,
    ) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let mut parent = ROOT;
        self.clock += 1;
        for block in tokens.chunks_exact(page_tokens as usize).take(max_pages) {
            let h = chain(parent, block);
            match self.map.get_mut(&h) {
                Some(e) if e.parent == parent && e.block == block => {
                    e.last_used = self.clock;
                    pool.retain(&[e.page]);
                    out.push((e.page, h));
                    parent = h;
                }
                _ => break,
            }
        }
        out
    }

    /// Remembers `page`, full with `block` after the prefix whose chain hash is `parent`; returns the page's
    /// chain hash. A page already known for that content is kept (the new one is not cached).
    pub fn insert(&mut self, pool: &mut PagePool, parent: u64, block: &[u32], page: u32) -> u64 {
        let h = chain(parent, block);
        self.clock += 1;
        if let Some(e) = self.map.get_mut(&h) {
            e.last_used = self.clock;
            return h;
        }
        pool.retain(&[page]);
        self.map.insert(
            h,
            Entry {
                page,
                parent,
                block: block.to_vec(),
                last_used: self.clock,
            },
        );
        h
    }

    /// Pages only the cache holds (what [`evict`](Self::evict) can free).
    pub fn evictable(&self, pool: &PagePool) -> u32 {
        self.map
            .values()
            .filter(|e| pool.holders(e.page) == 1)
            .count() as u32
    }

    /// Frees up to `n` pages only the cache holds, least recently used first; returns how many were freed.
    pub fn evict(&mut self, pool: &mut PagePool, n: u32) -> u32 {
        if n == 0 {
            return 0;
        }
        let mut idle: Vec<(u64, u64)> = self
            .map
            .iter()
            .filter(|(_, e)| pool.holders(e.page) == 1)
            .map(|(h, e)| (e.last_used, *h))
            .collect();
        idle.sort_unstable();
        let mut freed = 0;
        for (_, h) in idle.into_iter().take(n as usize) {
            if let Some(e) = self.map.remove(&h) {
                pool.release(&[e.page]);
                freed += 1;
            }
        }
        freed
    }

    /// Drops every entry (the pool is going away or being emptied).
    pub fn clear(&mut self, pool: &mut PagePool) {
        for (_, e) in self.map.drain() {
            pool.release(&[e.page]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_hit_whole_pages_and_eviction_spares_live_readers() {
        let pt = 4;
        let mut pool = PagePool::new(8);
        let mut cache = PrefixCache::default();
        let a: Vec<u32> = (0..10).collect();
        // Sequence a filled two pages (tokens 0..8); the cache learns them.
        let pages = pool.alloc(2).unwrap();
        let h0 = cache.insert(&mut pool, ROOT, &a[0..4], pages[0]);
        let h1 = cache.insert(&mut pool, h0, &a[4..8], pages[1]);
        assert_eq!(h1, chain(chain(ROOT, &a[0..4]), &a[4..8]));
        // b shares the first page only; c shares both; d shares nothing (same second block, other first).
        let mut b = a.clone();
        b[5] = 99;
        assert_eq!(cache.lookup(&mut pool, &b, pt, 8).len(), 1);
        assert_eq!(cache.lookup(&mut pool, &a, pt, 8).len(), 2);
        assert_eq!(cache.lookup(&mut pool, &a, pt, 1).len(), 1, "max_pages");
        let mut d = a.clone();
        d[0] = 7;
        assert!(cache.lookup(&mut pool, &d, pt, 8).is_empty());
        // Holders: a's own hold + cache + b + c + (c limited) for page 0.
        assert_eq!(pool.holders(pages[0]), 5);
        pool.release(&[pages[0], pages[0], pages[0], pages[1]]);
        pool.release(&[pages[0], pages[1]]);
        // Only the cache holds them now: both evictable, least recently used first.
        assert_eq!(cache.evictable(&pool), 2);
        assert_eq!(cache.evict(&mut pool, 1), 1);
        assert_eq!(cache.len(), 1);
        cache.clear(&mut pool);
        assert_eq!(pool.free(), 8);
    }

    #[test]
    fn a_page_a_sequence_reads_is_not_evicted() {
        let mut pool = PagePool::new(2);
        let mut cache = PrefixCache::default();
        let p = pool.alloc(1).unwrap()[0];
        cache.insert(&mut pool, ROOT, &[1, 2], p);
        // The writer still holds it.
        assert_eq!(cache.evict(&mut pool, 5), 0);
        pool.release(&[p]);
        assert_eq!(cache.evict(&mut pool, 5), 1);
        assert_eq!(pool.free(), 2);
    }
}
