import { lazy, Suspense, useEffect, useRef, useState, type ReactNode } from "react";
import { NavLink, Navigate, Route, Routes, useLocation } from "react-router-dom";
import {
  ApiError,
  forgetKey,
  onKeyRefused,
  storedKey,
  storeKey,
  whoami,
  type Access,
  type Whoami,
} from "./api";
import { may, SessionContext, useSession, type Session } from "./session";
import PageErrorBoundary from "./components/PageErrorBoundary";
import Approvals from "./pages/Approvals";
import Calls from "./pages/Calls";
import Config from "./pages/Config";
import Connect from "./pages/Connect";
import SignIn from "./pages/SignIn";
import Tools from "./pages/Tools";
import Upload from "./pages/Upload";

// The two pages with big libraries (rjsf with ajv, chart.js) load when first opened.
const Metrics = lazy(() => import("./pages/Metrics"));
const Tool = lazy(() => import("./pages/Tool"));

interface Page {
  path: string;
  label: string;
  needs: Access;
  element: ReactNode;
}

const PAGES: Page[] = [
  { path: "/tools", label: "Tools", needs: "read", element: <Tools /> },
  { path: "/upload", label: "Upload", needs: "manage", element: <Upload /> },
  { path: "/calls", label: "Calls", needs: "manage", element: <Calls /> },
  { path: "/metrics", label: "Metrics", needs: "manage", element: <Metrics /> },
  { path: "/config", label: "Config", needs: "manage", element: <Config /> },
  { path: "/approvals", label: "Approvals", needs: "decide", element: <Approvals /> },
  { path: "/connect", label: "Connect", needs: "read", element: <Connect /> },
];

export default function App() {
  const [identity, setIdentity] = useState<{ key: string; whoami: Whoami } | null>(null);
  const [restoring, setRestoring] = useState(() => storedKey() !== null);
  const [notice, setNotice] = useState<string | null>(null);

  useEffect(() => {
    const key = storedKey();
    if (!key) {
      return;
    }
    whoami(key)
      .then((who) => setIdentity({ key, whoami: who }))
      .catch((error: unknown) => {
        if (error instanceof ApiError && error.status === 401) {
          forgetKey();
        }
        setNotice(error instanceof Error ? error.message : String(error));
      })
      .finally(() => setRestoring(false));
  }, []);

  useEffect(() => {
    onKeyRefused(() => {
      forgetKey();
      setIdentity(null);
      setNotice("The server no longer takes your key: sign in again.");
    });
    return () => onKeyRefused(null);
  }, []);

  if (restoring) {
    return <p className="loading">Loading…</p>;
  }
  if (!identity) {
    return (
      <SignIn
        notice={notice}
        onSignedIn={(key, who) => {
          storeKey(key);
          setNotice(null);
          setIdentity({ key, whoami: who });
        }}
      />
    );
  }
  const session: Session = {
    ...identity,
    signOut: () => {
      forgetKey();
      setIdentity(null);
    },
  };
  return (
    <SessionContext value={session}>
      <Shell />
    </SessionContext>
  );
}

/** The signed-in layout: header, navigation (behind a Menu button on narrow screens) and
 * the page. */
function Shell() {
  const session = useSession();
  const location = useLocation();
  const mainRef = useRef<HTMLElement>(null);
  const [menuOpen, setMenuOpen] = useState(false);
  const pages = PAGES.filter((page) => may(session, page.needs));
  const current = pages.find((page) => location.pathname.startsWith(page.path));

  // After navigating, focus moves to the new page, as it would on a page load.
  const shownPath = useRef(location.pathname);
  useEffect(() => {
    if (shownPath.current !== location.pathname) {
      shownPath.current = location.pathname;
      setMenuOpen(false);
      mainRef.current?.focus();
    }
  }, [location.pathname]);

  useEffect(() => {
    document.title = current ? `${current.label} · toolhost` : "toolhost";
  }, [current]);

  return (
    <div className="shell">
      <a
        className="skip-link"
        href="#main"
        onClick={(event) => {
          event.preventDefault();
          mainRef.current?.focus();
        }}
      >
        Skip to main content
      </a>
      <header className="top-bar">
        <span className="brand">toolhost</span>
        <button
          type="button"
          className="menu-button"
          aria-expanded={menuOpen}
          aria-controls="main-nav"
          onClick={() => setMenuOpen((open) => !open)}
        >
          Menu
        </button>
        <span className="identity">
          <span className="tenant">{session.whoami.tenant}</span>{" "}
          <span className="role">{session.whoami.role}</span>
        </span>
        <button type="button" onClick={session.signOut}>
          Sign out
        </button>
      </header>
      <nav id="main-nav" className={menuOpen ? "side-nav open" : "side-nav"} aria-label="Main">
        <ul>
          {pages.map((page) => (
            <li key={page.path}>
              <NavLink to={page.path}>{page.label}</NavLink>
            </li>
          ))}
        </ul>
      </nav>
      <main id="main" ref={mainRef} tabIndex={-1}>
        <PageErrorBoundary path={location.pathname}>
          <Suspense fallback={<p aria-live="polite">Loading…</p>}>
            <Routes>
              <Route path="/" element={<Navigate to={pages[0]?.path ?? "/connect"} replace />} />
              {PAGES.map((page) => (
                <Route
                  key={page.path}
                  path={page.path}
                  element={may(session, page.needs) ? page.element : <NotAllowed page={page} />}
                />
              ))}
              <Route
                path="/tools/:name"
                element={may(session, "read") ? <Tool /> : <NotAllowed page={PAGES[0]} />}
              />
              <Route path="*" element={<NotFound />} />
            </Routes>
          </Suspense>
        </PageErrorBoundary>
      </main>
    </div>
  );
}

function NotAllowed({ page }: { page: Page }) {
  const { whoami } = useSession();
  return (
    <>
      <h1>{page.label}</h1>
      <p role="alert" className="alert">
        A key with the role <code>{whoami.role}</code> may not use this page (it needs{" "}
        <code>{page.needs}</code>).
      </p>
    </>
  );
}

function NotFound() {
  return (
    <>
      <h1>Not found</h1>
      <p>
        No such page. <NavLink to="/">Go to the start page</NavLink>.
      </p>
    </>
  );
}
