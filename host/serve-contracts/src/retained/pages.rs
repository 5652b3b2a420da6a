//! Paged retained state: the server owns a pool of fixed-size pages per prepared model (the package declares
//! tokens per page and bytes per page per layer; the pool's size comes from the model's memory budget), and each
//! sequence owns a page table. Pages are reference counted so that a shared prefix, a session, a checkpoint or
//! a fork holds the same immutable full pages; the only page a writer may change is one it holds alone. Sessions
//! never copy a partial page: its few tokens are recomputed into the writer's own page ([`super::sessions`]);
//! [`PageTable::fork`] (a copy plan for the partial page) is kept for a package-side copy, unused by the server.
//!
//! The pool is owned by the model's scheduler thread (no locks); every page index it hands out is released
//! exactly once per retain, which the tests check by returning the pool to full.

/// Not enough free pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolFull {
    pub needed: u32,
    pub free: u32,
}

impl std::fmt::Display for PoolFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the page pool has {} free pages, {} needed",
            self.free, self.needed
        )
    }
}

/// A pool of `capacity` pages, numbered 0..capacity.
#[derive(Debug, Clone)]
pub struct PagePool {
    refs: Vec<u32>,
    free: Vec<u32>,
    peak: u32,
}

impl PagePool {
    pub fn new(capacity: u32) -> PagePool {
        PagePool {
            refs: vec![0; capacity as usize],
            // Popped from the end: lower pages first.
            free: (0..capacity).rev().collect(),
            peak: 0,
        }
    }

    pub fn capacity(&self) -> u32 {
        self.refs.len() as u32
    }

    pub fn free(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.capacity() - self.free()
    }

    /// The most pages in use at once.
    pub fn peak(&self) -> u32 {
        self.peak
    }

    /// `n` fresh pages (reference count 1), all or none.
    pub fn alloc(&mut self, n: u32) -> Result<Vec<u32>, PoolFull> {
        if n > self.free() {
            return Err(PoolFull {
                needed: n,
                free: self.free(),
            });
        }
        let at = self.free.len() - n as usize;
        let pages: Vec<u32> = self.free.drain(at..).rev().collect();
        for &p in &pages {
            debug_assert_eq!(self.refs[p as usize], 0);
            self.refs[p as usize] = 1;
        }
        self.peak = self.peak.max(self.used());
        Ok(pages)
    }

    /// One more holder of each of `pages` (a shared prefix, a checkpoint, a fork).
    pub fn retain(&mut self, pages: &[u32]) {
        for &p in pages {
            let r = &mut self.refs[p as usize];
            assert!(*r > 0, "retain of free page {p}");
            *r += 1;
        }
    }

    /// One holder fewer of each of `pages`; a page nobody holds is free again.
    pub fn release(&mut self, pages: &[u32]) {
        for &p in pages {
            let r = &mut self.refs[p as usize];
            assert!(*r > 0, "release of free page {p}");
            *r -= 1;
            if *r == 0 {
                self.free.push(p);
            }
        }
    }

    /// How many holders page `p` has.
    pub fn holders(&self, p: u32) -> u32 {
        self.refs[p as usize]
    }
}

/// One sequence's pages: token `t` of the sequence lives in page `pages[t / page_tokens]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageTable {
    pub pages: Vec<u32>,
    /// Tokens whose state is committed (written and ready).
    pub tokens: u32,
}

/// A page a fork must copy before its first write: the source's partial frontier page into the fork's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageCopy {
    pub from: u32,
    pub to: u32,
    /// Tokens of the page that are live.
    pub tokens: u32,
}

impl PageTable {
    /// Pages needed to hold `tokens` tokens.
    pub fn pages_for(tokens: u32, page_tokens: u32) -> u32 {
        tokens.div_ceil(page_tokens)
    }

    /// Makes room for `extra` more tokens after the committed ones: allocates the missing pages (all or none).
    pub fn reserve(
        &mut self,
        pool: &mut PagePool,
        extra: u32,
        page_tokens: u32,
    ) -> Result<(), PoolFull> {
        let want = Self::pages_for(self.tokens + extra, page_tokens);
        let have = self.pages.len() as u32;
        if want > have {
            let new = pool.alloc(want - have)?;
            self.pages.extend(new);
        }
        Ok(())
    }

    /// Commits `n` more tokens (their state is written and ready); they must have been reserved.
    pub fn commit(&mut self, n: u32, page_tokens: u32) {
        assert!(
            Self::pages_for(self.tokens + n, page_tokens) <= self.pages.len() as u32,
            "commit past the reserved pages"
        );
        self.tokens += n;
    }

    /// Rewinds to `tokens` committed tokens, releasing the pages past them (and unused reservations).
    pub fn truncate(&mut self, pool: &mut PagePool, tokens: u32, page_tokens: u32) {
        let tokens = tokens.min(self.tokens);
        let keep = Self::pages_for(tokens, page_tokens) as usize;
        if keep < self.pages.len() {
            pool.release(&self.pages[keep..]);
            self.pages.truncate(keep);
        }
        self.tokens = tokens;
    }

    /// A new sequence continuing from this one's committed state: full pages are shared (retained); a partial
    /// frontier page gets a fresh page in the fork, with the copy the caller must make before either writes.
    pub fn fork(
        &self,
        pool: &mut PagePool,
        page_tokens: u32,
    ) -> Result<(PageTable, Option<PageCopy>), PoolFull> {
        let full = (self.tokens / page_tokens) as usize;
        let partial = self.tokens % page_tokens;
        let mut pages = self.pages[..full].to_vec();
        let mut copy = None;
        if partial > 0 {
            let fresh = pool.alloc(1)?[0];
            copy = Some(PageCopy {
                from: self.pages[full],
                to: fresh,
                tokens: partial,
            });
            pool.retain(&pages);
            pages.push(fresh);
        } else {
            pool.retain(&pages);
        }
        Ok((
            PageTable {
                pages,
                tokens: self.tokens,
            },
            copy,
        ))
    }

    /// Releases every page (completion, cancellation, disconnect, unregister).
    pub fn clear(&mut self, pool: &mut PagePool) {
        pool.release(&self.pages);
        self.pages.clear();
        self.tokens = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_all_or_nothing_and_release_frees() {
        let mut pool = PagePool::new(4);
        let a = pool.alloc(3).unwrap();
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(pool.alloc(2), Err(PoolFull { needed: 2, free: 1 }));
        assert_eq!(pool.free(), 1);
        pool.retain(&a[..1]);
        pool.release(&a);
        assert_eq!(pool.free(), 3, "page 0 is still held once");
        pool.release(&a[..1]);
        assert_eq!(pool.free(), 4);
        assert_eq!(pool.peak(), 3);
    }

    #[test]
    fn tables_grow_rewind_and_fork() {
        let pt = 16;
        let mut pool = PagePool::new(10);
        let mut a = PageTable::default();
        a.reserve(&mut pool, 40, pt).unwrap();
        assert_eq!(a.pages.len(), 3);
        a.commit(40, pt);
        // A fork shares the two full pages and copies the partial third.
        let (mut b, copy) = a.fork(&mut pool, pt).unwrap();
        let copy = copy.unwrap();
        assert_eq!((copy.from, copy.tokens), (a.pages[2], 8));
        assert_eq!(b.pages[..2], a.pages[..2]);
        assert_ne!(b.pages[2], a.pages[2]);
        assert_eq!(pool.holders(a.pages[0]), 2);
        // Each writes on: b grows into new pages, a rewinds into its shared prefix.
        b.reserve(&mut pool, 24, pt).unwrap();
        b.commit(24, pt);
        assert_eq!(b.pages.len(), 4);
        a.truncate(&mut pool, 10, pt);
        assert_eq!((a.pages.len(), a.tokens), (1, 10));
        assert_eq!(pool.holders(b.pages[1]), 1, "a released its hold on page 1");
        // A page-aligned fork copies nothing.
        let (mut c, copy) = b.fork(&mut pool, pt).unwrap();
        assert_eq!(copy, None);
        b.truncate(&mut pool, 64, pt);
        assert_eq!(b.tokens, 64);
        for t in [&mut a, &mut b, &mut c] {
            t.clear(&mut pool);
        }
        assert_eq!(pool.free(), pool.capacity(), "every page came back");
    }

    #[test]
    fn a_full_pool_refuses_without_leaking() {
        let mut pool = PagePool::new(3);
        let mut a = PageTable::default();
        a.reserve(&mut pool, 33, 16).unwrap();
        a.commit(33, 16);
        let mut b = PageTable::default();
        assert_eq!(
            b.reserve(&mut pool, 17, 16),
            Err(PoolFull { needed: 2, free: 0 })
        );
        assert!(a.fork(&mut pool, 16).is_err());
        assert_eq!(pool.holders(a.pages[0]), 1, "a failed fork retains nothing");
        a.clear(&mut pool);
        assert_eq!(pool.free(), 3);
    }
}
