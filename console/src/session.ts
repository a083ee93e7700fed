import { createContext, useContext } from "react";
import type { Access, Whoami } from "./api";

export interface Session {
  whoami: Whoami;
  key: string;
  signOut: () => void;
}

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) {
    throw new Error("useSession outside a signed-in console");
  }
  return session;
}

export const may = (session: Session, access: Access) => session.whoami.may.includes(access);
